"""A hand-back takes the countdown requests of the queue off Celery's timer on every Celery
the package supports, whether or not its worker state tracks scheduled requests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state as worker_state
from celery.worker.request import Request

from celery_beetle.ops.handback_control import HandBackControl


class HeldRequest(Request):
    """A countdown request waiting in Celery's timer, its delivery from consumer tag ``tag``."""

    def __init__(self, tag: str) -> None:
        self._message = SimpleNamespace(delivery_info={"consumer_tag": tag})
        self.requeued: bool | None = None

    @property
    def id(self) -> str:
        return "t-1"

    def reject(self, requeue: bool = False) -> None:
        self.requeued = requeue
        self.acknowledged = True


class Timer:
    def __init__(self, *requests: Request) -> None:
        entries = [SimpleNamespace(entry=SimpleNamespace(args=(r,))) for r in requests]
        self.schedule = SimpleNamespace(queue=entries)
        self.cancelled: list[Any] = []

    def cancel(self, entry: Any) -> None:
        self.cancelled.append(entry)


class QoS:
    def __init__(self) -> None:
        self.decrements = 0

    def decrement_eventually(self) -> None:
        self.decrements += 1


@pytest.mark.parametrize("tracked", [True, False], ids=["celery-newer", "celery-5.3"])
def test_a_countdown_request_of_a_handed_back_queue_is_requeued(
    monkeypatch: pytest.MonkeyPatch, tracked: bool
) -> None:
    if not tracked:
        monkeypatch.delattr(worker_state, "scheduled_requests", raising=False)
    held, other = HeldRequest("orders-tag"), HeldRequest("other-tag")
    consumer = SimpleNamespace(timer=Timer(held, other), qos=QoS())
    control = HandBackControl(consumer)
    control.tags.add("orders-tag")

    assert control._hand_back_scheduled() == 1
    assert held.requeued is True and other.requeued is None
    assert consumer.qos.decrements == 1
    assert len(consumer.timer.cancelled) == 1
