"""Dead letters without a broker: naming, replay headers, selection, the replay rule."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from celery_beetle.deadletter import dead_letter_headers
from celery_beetle.ops.dead_letters import DeadLetter, describe, select
from celery_beetle.ops.replay import REPLAY_HEADER, replay_headers
from celery_beetle.outcome import Replay, decide_replay
from celery_beetle.state import State, Status
from kombu_beetle.envelope import EXPIRES_AT_HEADER, FLAGS_HEADER


def letter(headers, message_id="m1", task="t.a"):  # type: ignore[no-untyped-def]
    queue, scope, reason, replay_id = describe("jobs.dead", headers, message_id)
    return DeadLetter(
        message_id, queue, scope, replay_id, reason, b"[[1], {}, {}]", "application/json",
        "utf-8", {"task": task, **headers}, {"message_id": message_id},
    )  # fmt: skip


def test_a_workers_dead_letter_names_its_queue_scope_reason_and_a_stable_replay_id():
    headers = dead_letter_headers("not_retryable", "jobs", scope="jobs-scope", now_ms=5, worker="w")
    queue, scope, reason, replay_id = describe("jobs.dead", headers, "m1")
    assert (queue, scope, reason) == ("jobs", "jobs-scope", "not_retryable")
    assert describe("jobs.dead", dict(headers), "m1")[3] == replay_id  # a copy: the same id
    later = dead_letter_headers("not_retryable", "jobs", scope="jobs-scope", now_ms=6, worker="w")
    assert describe("jobs.dead", later, "m1")[3] != replay_id  # another death: another id


def test_a_brokers_dead_letter_is_named_from_x_death():
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    headers = {
        "x-death": [
            {"queue": "jobs", "reason": "expired", "time": when, "count": 1},
            {"queue": "jobs.delay.500", "reason": "expired", "time": when, "count": 1},
        ]
    }
    queue, scope, reason, _ = describe("jobs.dead", headers, "m1")
    assert (queue, scope, reason) == ("jobs", "jobs", "broker:expired")
    assert letter(headers).dead_at_ms == int(when.timestamp() * 1000)


def test_a_replay_restores_redundancy_drops_death_headers_and_the_old_expiry():
    headers = dead_letter_headers("attempts_limit", "jobs", now_ms=5)
    headers.update({"x-beetle-dead-flags": 3, EXPIRES_AT_HEADER: 1, "x-death": []})
    out = replay_headers(letter(headers))
    assert out[FLAGS_HEADER] == 1  # redundant, no longer degraded
    assert EXPIRES_AT_HEADER not in out and "x-death" not in out
    assert not any(k.startswith("x-beetle-dead-") for k in out)
    assert out["task"] == "t.a" and out[REPLAY_HEADER] == letter(headers).replay_id


def test_selection_needs_a_name_and_matches_ids_or_tasks():
    a, b = letter({}, "m1", "t.a"), letter({}, "m2", "t.b")
    assert select([a, b], ids=["m2"]) == [b]
    assert select([a, b], task="t.a") == [a]
    assert select([a, b], everything=True) == [a, b]
    with pytest.raises(ValueError, match="name the dead letters"):
        select([a, b])


def test_arguments_are_decoded_and_cut():
    assert letter({}).arguments() == '{"args": [1], "kwargs": {}}'
    assert letter({}).arguments(limit=5).startswith('{"arg... (')


@pytest.mark.parametrize(
    ("state", "mark", "expected"),
    [
        (None, None, Replay.RUN),
        (State(Status.FAILED), None, Replay.RUN),
        (State(Status.FAILED, dead_letter_owed=True), None, Replay.IN_FLIGHT),
        (State(Status.COMPLETED), None, Replay.COMPLETED),
        (State(Status.RUNNING), None, Replay.IN_FLIGHT),
        (State(Status.PENDING), None, Replay.IN_FLIGHT),
        (State(Status.RUNNING), "r:d1", Replay.REPUBLISH),
        (None, "p:d1", Replay.DONE),
        (State(Status.COMPLETED), "p:other", Replay.COMPLETED),
    ],
)
def test_the_replay_rule(state, mark, expected):
    assert decide_replay(state, mark, "d1") is expected
