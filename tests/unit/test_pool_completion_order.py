"""A run the pool claimed stores its completion after Celery sent what follows the body (its
callbacks, its chain's next link), as the gate's completion before the ack does.

The fault explorer's seed 97040: with ``beetle_redis_wait_replicas`` the gate cannot claim,
so the pool claims and completes. A chain's first link returned during a Sentinel failover;
its completion, stored once Redis came back, came before Celery published the next link, and
the worker was killed in between. The next copy found the message completed and dropped it:
the chain's second task was never published. Celery's real tracer runs the task here, over a
:class:`~celery_beetle.store.fake.FakeStore`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, states
from celery.app.trace import build_tracer
from celery.canvas import Signature
from celery.exceptions import Reject

from celery_beetle.store.decisions import Fence, FenceDecision
from celery_beetle.store.fake import FakeStore
from celery_beetle.store.state import Status
from celery_beetle.task import BeetleTask
from celery_beetle.worker import run as run_module
from celery_beetle.worker import run_state


class _RecordingStore(FakeStore):
    def __init__(self, order: list[str]) -> None:
        super().__init__()
        self.order = order

    def complete(self, facts: Any, token: int) -> Any:
        self.order.append("completion stored")
        return super().complete(facts, token)


@pytest.fixture
def pool(monkeypatch) -> SimpleNamespace:
    """The pool's store, and what happened in which order."""
    order: list[str] = []
    store = _RecordingStore(order)
    monkeypatch.setattr(run_module, "process_store", lambda settings: store)

    def apply_async(sig: Signature, *args: Any, **kwargs: Any) -> None:
        order.append(f"published {sig.task}")

    monkeypatch.setattr(Signature, "apply_async", apply_async)
    return SimpleNamespace(order=order, store=store)


@pytest.fixture(scope="module")
def app() -> Celery:
    app = Celery("order", task_cls=BeetleTask, set_as_current=False)
    app.conf.update(beetle_redis_url="redis://127.0.0.1:1/0", task_ignore_result=True)

    @app.task(name="t.first")
    def first() -> str:
        return "one"

    @app.task(name="t.second")
    def second(value: str) -> str:
        return value

    return app


def _run(app: Celery, **request: Any) -> Any:
    task = app.tasks["t.first"]
    trace = build_tracer(task.name, task, eager=False, propagate=True, app=app)
    delivery = {"routing_key": "celery", "exchange": "", "redelivered": False}
    return trace(
        "task-1",
        (),
        {},
        {
            "id": "task-1",
            "delivery_info": delivery,
            "properties": {"message_id": "m-1"},
            "hostname": "w@test",
            **request,
        },
    )


def test_a_chain_link_is_published_before_the_pool_stores_its_completion(pool, app):
    _run(app, chain=[dict(app.tasks["t.second"].s())])
    assert pool.order == ["published t.second", "completion stored"]
    assert getattr(run_state.running, "owed", None) is None


def test_a_link_callback_is_published_before_the_pool_stores_its_completion(pool, app):
    _run(app, callbacks=[dict(app.tasks["t.second"].s())])
    assert pool.order == ["published t.second", "completion stored"]


def test_a_run_with_nothing_to_send_completes_as_its_body_returns(pool, app):
    _run(app)
    assert pool.order == ["completion stored"]
    state = pool.store.peek("celery", "m-1")
    assert state is not None and state.status is Status.COMPLETED


def test_a_completion_refused_after_the_chain_tells_the_ack_in_this_process(pool, app, monkeypatch):
    """Its lease was taken over meanwhile: the other run sends the same link again (one
    message id) and owns the message, so the ack must not call it completed."""
    refused = FenceDecision(Fence.NOT_OWNER, status=Status.RUNNING, token=9)
    monkeypatch.setattr(pool.store, "complete", lambda facts, token: refused)
    _run(app, chain=[dict(app.tasks["t.second"].s())])
    assert pool.order == ["published t.second"]
    assert run_state.refused_completion("task-1")
    assert not run_state.refused_completion("task-1")


def test_a_completion_that_finds_no_record_requeues_its_copy(pool, app, monkeypatch):
    """A Redis failover lost the claim: nobody took the message over, and its twin may be
    gone with its broker, so the copy goes back to its queue rather than being acked."""
    refused = FenceDecision(Fence.NOT_OWNER)
    monkeypatch.setattr(pool.store, "complete", lambda facts, token: refused)
    info = _run(app)[1]  # Celery's TraceInfo: the state, and what the run raised
    assert info.state == states.REJECTED
    assert isinstance(info.retval, Reject) and info.retval.requeue


def test_an_owed_completion_that_finds_no_record_sends_its_copy_back(pool, app, monkeypatch):
    """Celery acks the copy as the task ends, too late for a requeue: a Redis failover lost
    the claim and nobody took the message over, so the run publishes it again and the body
    runs again (its chain's next link, sent again, keeps its message id and runs once)."""
    from celery_beetle.worker import send_back

    sent: list[str] = []
    monkeypatch.setattr(
        send_back, "publish_delayed", lambda producer, raw, queue, *a: sent.append(queue)
    )
    monkeypatch.setattr(pool.store, "complete", lambda facts, token: FenceDecision(Fence.NOT_OWNER))
    _run(app, chain=[dict(app.tasks["t.second"].s())])
    assert pool.order == ["published t.second"]
    assert sent == ["celery"]
    assert not run_state.refused_completion("task-1")
