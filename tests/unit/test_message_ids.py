"""A BeetleTask's ``message_id``: one per publish, stable across a run's take-over."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from celery_beetle.message_ids import publish_message_id
from celery_beetle.worker.facts import FACTS_HEADER


def _app(request: Any = None) -> Any:
    task = None if request is None else SimpleNamespace(request=request)
    return SimpleNamespace(current_worker_task=task)


def _run(message_id: str, task_id: str = "running", scope: str = "jobs") -> Any:
    """The request of a run the gate let through (its facts header names the message)."""
    facts = {"queue": scope, "scope": scope, "message_id": message_id, "expires_at_ms": 1}
    return SimpleNamespace(
        id=task_id,
        called_directly=False,
        is_eager=False,
        delivery_info={"routing_key": scope},
        properties={"message_id": message_id},
        **{FACTS_HEADER: facts},
    )


def test_a_client_publishing_one_task_id_twice_publishes_two_messages():
    app = _app()
    assert publish_message_id(app, "t-1", {}) != publish_message_id(app, "t-1", {})


def test_a_run_taken_over_publishes_the_same_ids_again():
    first = publish_message_id(_app(_run("m-1")), "next", {})
    assert publish_message_id(_app(_run("m-1")), "next", {}) == first


def test_two_runs_publishing_one_frozen_task_id_publish_two_messages():
    one = publish_message_id(_app(_run("m-1")), "body", {})
    other = publish_message_id(_app(_run("m-2")), "body", {})
    assert one != other


def test_one_run_publishing_one_task_id_twice_publishes_two_messages():
    run = _run("m-1")
    assert publish_message_id(_app(run), "body", {}) != publish_message_id(_app(run), "body", {})


def test_the_same_message_in_two_scopes_publishes_two_messages():
    one = publish_message_id(_app(_run("m-1", scope="billing")), "next", {})
    other = publish_message_id(_app(_run("m-1", scope="shipping")), "next", {})
    assert one != other


def test_a_retry_or_replacement_names_the_first_message_of_its_task():
    assert publish_message_id(_app(_run("m-1", "t")), "t", {"retries": 1}) == "m-1:retry-1"
    assert publish_message_id(_app(_run("m-1:retry-1", "t")), "t", {"retries": 2}) == (
        "m-1:retry-2"
    )
    replaced = publish_message_id(_app(_run("m-1", "t")), "t", {"replaced_task_nesting": 1})
    assert replaced == "m-1:replace-1"
    retried_replacement = {"retries": 1, "replaced_task_nesting": 1}  # Celery passes both
    assert publish_message_id(_app(_run("m-1:replace-1", "t")), "t", retried_replacement) == (
        "m-1:replace-1:retry-1"
    )


def test_a_retry_of_a_previous_release_message_keeps_its_task_id_form():
    """The previous release made the task id the ``message_id``: its retries stay
    ``<task id>:retry-N``, so a run of each release publishes the same retry."""
    assert publish_message_id(_app(_run("t", "t")), "t", {"retries": 3}) == "t:retry-3"


def test_a_task_called_directly_or_eagerly_is_no_run():
    direct = _run("m-1")
    direct.called_directly = True
    eager = _run("m-1")
    eager.is_eager = True
    for request in (direct, eager):
        app = _app(request)
        assert publish_message_id(app, "next", {}) != publish_message_id(app, "next", {})


def test_a_plain_tasks_run_derives_from_its_messages_property():
    plain = SimpleNamespace(
        id="p", called_directly=False, is_eager=False,
        delivery_info={"routing_key": "celery"}, properties={"message_id": "m-9"},
    )  # fmt: skip
    again = SimpleNamespace(**vars(plain))
    assert publish_message_id(_app(plain), "next", {}) == publish_message_id(
        _app(again), "next", {}
    )


def test_a_new_task_gets_a_new_id_even_inside_a_run():
    app = _app(_run("m-1"))
    assert publish_message_id(app, None, {}) != publish_message_id(app, None, {})
