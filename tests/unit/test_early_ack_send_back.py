"""With ``acks_late`` off, a copy the pool could not claim is published again, never dropped.

Celery acks such a copy as a pool process takes it, so the ``Reject`` of a hand-back or a
deferral does nothing: the copy was gone. The fault explorer's seed 111002: a countdown
task came due on two workers during one Redis outage, each copy was acked and its claim
refused, and the message was lost. Celery's real tracer runs the task here, over a
:class:`~celery_beetle.store.fake.FakeStore`; the publish is recorded, not sent.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app.trace import build_tracer

from celery_beetle.store.fake import FakeStore
from celery_beetle.store.outcome import Limits
from celery_beetle.store.state import MessageFacts
from celery_beetle.task import BeetleTask
from celery_beetle.worker import run as run_module
from celery_beetle.worker import run_calls, send_back
from celery_beetle.worker.errors import Dropped, HandBack
from celery_beetle.worker.send_back import SENT_BACK_HEADER
from kombu_beetle.envelope import FLAG_REDUNDANT, FLAGS_HEADER


class _RefusingStore(FakeStore):
    """Redis refuses every claim (as an out-of-memory master does)."""

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise redis.ConnectionError("refused")


@pytest.fixture
def sent(monkeypatch) -> list[SimpleNamespace]:
    """What the runs published again (queue, delay, message id)."""
    published: list[SimpleNamespace] = []

    def publish_delayed(producer: Any, raw: Any, queue: str, delay_ms: int, scope: Any) -> str:
        published.append(SimpleNamespace(queue=queue, delay_ms=delay_ms, raw=raw))
        return queue

    monkeypatch.setattr(send_back, "publish_delayed", publish_delayed)
    monkeypatch.setattr(run_calls, "retry_window", lambda task, request: 0.15)
    return published


@pytest.fixture(scope="module")
def app() -> Celery:
    app = Celery("early", task_cls=BeetleTask, broker="memory://", set_as_current=False)
    app.conf.update(beetle_redis_url="redis://127.0.0.1:1/0", task_ignore_result=True)

    @app.task(name="t.early", acks_late=False)
    def early() -> str:
        return "ran"

    @app.task(name="t.late")
    def late() -> str:
        return "ran"

    return app


def _run(app: Celery, name: str, store: FakeStore, monkeypatch, **headers: Any) -> Any:
    monkeypatch.setattr(run_module, "process_store", lambda settings: store)
    task = app.tasks[name]
    trace = build_tracer(task.name, task, eager=False, propagate=False, app=app)
    delivery = {"routing_key": "celery", "exchange": "", "redelivered": False}
    request = {
        "id": "task-1",
        "delivery_info": delivery,
        "properties": {"message_id": "m-1", "application_headers": headers},
        "hostname": "w@test",
    }
    return trace("task-1", (), {}, request)


def _raised(result: Any) -> BaseException:
    """What the run raised, as Celery's tracer recorded it."""
    exc = result.retval.exception
    return getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback


def test_an_early_acked_copy_whose_claim_redis_refused_is_published_again(app, sent, monkeypatch):
    result = _run(app, "t.early", _RefusingStore(), monkeypatch)
    assert isinstance(_raised(result), Dropped)  # acked without a result: not a run
    assert [(s.queue, s.delay_ms) for s in sent] == [("celery", 2000)]
    assert sent[0].raw.properties["message_id"] == "m-1"  # the same record in the store


def test_a_copy_sent_back_again_waits_twice_as_long_and_stays_one_copy(app, sent, monkeypatch):
    headers = {FLAGS_HEADER: FLAG_REDUNDANT, SENT_BACK_HEADER: 1, "task": "t.early", "id": "t-1"}
    _run(app, "t.early", _RefusingStore(), monkeypatch, **headers)
    assert [s.delay_ms for s in sent] == [4000]
    sent_headers = sent[0].raw.headers
    assert sent_headers[SENT_BACK_HEADER] == 2
    assert not sent_headers[FLAGS_HEADER] & FLAG_REDUNDANT  # one copy back for the one taken


def test_an_early_acked_copy_another_run_holds_is_published_again(app, sent, monkeypatch):
    store = FakeStore()
    store.claim(MessageFacts("celery", "m-1", 2_000_000_000_000), Limits(), "another-run")
    result = _run(app, "t.early", store, monkeypatch)
    assert isinstance(_raised(result), Dropped)
    assert [(s.queue, s.delay_ms) for s in sent] == [("celery", 1000)]


def test_a_late_acked_copy_whose_claim_redis_refused_is_handed_back_unacked(app, sent, monkeypatch):
    result = _run(app, "t.late", _RefusingStore(), monkeypatch)
    assert isinstance(_raised(result), HandBack)
    assert sent == []


def test_a_copy_no_broker_takes_back_is_handed_back_as_before(app, sent, monkeypatch):
    def no_broker(*args: Any, **kwargs: Any) -> str:
        raise ConnectionError("every broker is down")

    monkeypatch.setattr(send_back, "publish_delayed", no_broker)
    result = _run(app, "t.early", _RefusingStore(), monkeypatch)
    assert isinstance(_raised(result), HandBack)


class _RecordLosingStore(FakeStore):
    """A Redis failover lost the claim: the completion finds no record of the message."""

    def complete(self, facts: MessageFacts, token: int) -> Any:
        self.forget(facts.scope, facts.message_id)
        return super().complete(facts, token)


def test_an_early_acked_copy_whose_completion_finds_no_record_is_published_again(
    app, sent, monkeypatch
):
    """Nobody took the run over; Celery acked the copy as the pool took it, so a requeue
    would do nothing and the message would rest on its twin alone: it is sent back."""
    result = _run(app, "t.early", _RecordLosingStore(), monkeypatch)
    assert isinstance(_raised(result), Dropped)
    assert [(s.queue, s.delay_ms) for s in sent] == [("celery", 1000)]
