"""Workers hand back what they hold of a queue, so that a migration can delete it.

Deleting a queue drops the deliveries its consumers hold unacked: RabbitMQ deletes a queue
whatever its consumers hold (``if-unused`` looks at consumers, ``if-empty`` at ready
messages). A worker holds deliveries for long: a countdown or ETA task waits in Celery's
timer until its time (hours, perhaps), the gate defers a copy whose twin runs elsewhere,
waits with a copy whose twin runs here, parks copies while Redis is away. Both copies of
one task can be held so, and a migration deletes the queue on every broker in turn: when
the workers then stop, the task is gone. So ``beetle queues migrate`` asks the workers to
hand back what they hold of the queue before it deletes it (:mod:`celery_beetle.ops.migrate`
waits until the broker shows the queue with no consumer and no unacked message).

Two remote-control commands, registered with Celery's when this module is imported
(:func:`celery_beetle.install` does), and run on the worker's event loop:

``beetle_hand_back(queue)``
    Stop consuming ``queue`` (on every broker, as Celery's ``cancel_consumer``), then give
    back every delivery of it the worker holds and has not started: the ETA/countdown
    requests in Celery's timer are taken off the timer and rejected with requeue; the
    gate's waiting and parked copies are requeued at once
    (:meth:`~celery_beetle.worker.gate.DeliveryGate.give_back_held`), its deferred ones when it
    next looks at them (within ``recheck_max_s``:
    :attr:`~celery_beetle.worker.gate.DeliveryGate.handing_back`). Requests already handed
    to the pool run and are acked as usual; the migration waits for them. A delivery is
    recognised by its consumer tag (kombu_beetle uses one tag per queue on every broker),
    noted before the consumer is cancelled.
``beetle_consume(queue)``
    Consume ``queue`` again, as the worker's configuration declares it.

A worker that is never told to consume again (the migration process died between the two)
consumes the queue again by itself after ``resume_after_s`` (given with the hand-back;
the migration asks again while it waits, which pushes the time back); ``0`` never (the
temporary queue of a migration, deleted afterwards).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker import state as worker_state
from celery.worker.control import control_command
from celery.worker.request import Request

__all__ = ["BeetleHandBackStep", "HandBackControl"]

logger = logging.getLogger(__name__)

#: a worker told to hand a queue back consumes it again by itself after this, unless told sooner
DEFAULT_RESUME_AFTER_S = 600.0


def consumer_tag(message: Any) -> str | None:
    info = getattr(message, "delivery_info", None) or {}
    tag = info.get("consumer_tag")
    return str(tag) if tag else None


class HandBackControl:
    """What one worker's consumer hands back: the consumer tags of the queues it was told
    to hand back, forgotten when the consumer restarts (a new consumer numbers its tags
    afresh, and its broker connections hold none of the old deliveries)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.tags: set[str] = set()
        #: queue -> the timer entry that consumes it again if nobody says so
        self._resume_timers: dict[str, Any] = {}

    def handing_back(self, message: Any) -> bool:
        """The gate's :attr:`~celery_beetle.worker.gate.DeliveryGate.handing_back` predicate."""
        return bool(self.tags) and consumer_tag(message) in self.tags

    def reset(self) -> None:
        self.tags.clear()

    def hand_back(self, queue: str, resume_after_s: float) -> None:
        c = self.consumer
        active = getattr(c.task_consumer, "_active_tags", None) or {}
        tag = active.get(queue)
        if tag is not None:
            self.tags.add(str(tag))
        if c.task_consumer.consuming_from(queue):
            c.cancel_task_queue(queue)
        given = self._hand_back_scheduled()
        step = getattr(c, "beetle_gate", None)
        gate = getattr(step, "gate", None)
        if gate is not None:
            given += gate.give_back_held()
        logger.warning(
            "beetle: handing back queue %r (a migration): stopped consuming it, %d held "
            "delivery(ies) given back; consuming it again when told to, or in %.0f s",
            queue,
            given,
            resume_after_s,
        )
        if resume_after_s > 0:
            self._schedule_resume(queue, resume_after_s)

    def consume(self, queue: str) -> None:
        timer = self._resume_timers.pop(queue, None)
        if timer is not None:
            _cancel(self.consumer.timer, timer)
        c = self.consumer
        if c.task_consumer is None or c.task_consumer.consuming_from(queue):
            return
        if queue not in c.app.amqp.queues:
            logger.warning("beetle: told to consume %r, which this worker does not know", queue)
            return
        c.add_task_queue(queue)

    def _hand_back_scheduled(self) -> int:
        """Take every ETA/countdown request of a handed-back queue off Celery's timer and
        reject it with requeue (Celery raised the prefetch window for it: lowered again)."""
        c = self.consumer
        given = 0
        for waiting in list(c.timer.schedule.queue):
            entry = getattr(waiting, "entry", None)
            args = getattr(entry, "args", None) or ()
            request = args[0] if args else None
            if not isinstance(request, Request) or request.acknowledged:
                continue
            if consumer_tag(request.message) not in self.tags:
                continue
            if request in worker_state.reserved_requests or request in worker_state.active_requests:
                continue
            _cancel(c.timer, entry)
            scheduled = getattr(worker_state, "scheduled_requests", None)  # Celery 5.3 has none
            if scheduled is not None:
                scheduled.discard(request)
            if worker_state.requests.get(request.id) is request:
                worker_state.requests.pop(request.id, None)
            c.qos.decrement_eventually()
            request.reject(requeue=True)
            given += 1
        return given

    def _schedule_resume(self, queue: str, after_s: float) -> None:
        previous = self._resume_timers.pop(queue, None)
        if previous is not None:
            _cancel(self.consumer.timer, previous)

        def resume() -> None:
            self._resume_timers.pop(queue, None)
            logger.warning("beetle: consuming %r again (no migration said so in time)", queue)
            self.consume(queue)

        self._resume_timers[queue] = self.consumer.timer.call_after(after_s, resume)


def _cancel(timer: Any, entry: Any) -> None:
    try:
        timer.cancel(entry)
    except Exception as exc:  # already fired or gone with its timer: nothing to cancel
        logger.debug("beetle: cancelling a timer entry: %r", exc)


def _control(state: Any) -> HandBackControl | None:
    control = getattr(state.consumer, "beetle_handback", None)
    return control if isinstance(control, HandBackControl) else None


@control_command(
    args=[("queue", str), ("resume_after_s", float)],
    signature="<queue> [resume_after_s]",
)
def beetle_hand_back(
    state: Any, queue: str, resume_after_s: float = DEFAULT_RESUME_AFTER_S, **_: Any
) -> dict[str, str]:
    """Stop consuming ``queue`` and requeue the deliveries of it held here (a migration)."""
    control = _control(state)
    if control is None:
        return {"error": "no beetle hand-back here (celery_beetle.install not called)"}
    state.consumer.call_soon(control.hand_back, queue, float(resume_after_s))
    return {"ok": f"handing back {queue}"}


@control_command(args=[("queue", str)], signature="<queue>")
def beetle_consume(state: Any, queue: str, **_: Any) -> dict[str, str]:
    """Consume ``queue`` again after :func:`beetle_hand_back`."""
    control = _control(state)
    if control is None:
        return {"error": "no beetle hand-back here (celery_beetle.install not called)"}
    state.consumer.call_soon(control.consume, queue)
    return {"ok": f"consuming {queue}"}


class BeetleHandBackStep(bootsteps.StartStopStep):
    """Gives the consumer its :class:`HandBackControl` and the gate its predicate."""

    name = "celery_beetle.ops.handback_control.BeetleHandBackStep"
    label = "Beetle hand-back"
    requires = ("celery_beetle.worker.bootstep.BeetleGateStep",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        c.beetle_handback = self.control = HandBackControl(c)

    def start(self, c: Any) -> None:
        self.control.reset()
        step = getattr(c, "beetle_gate", None)
        gate = getattr(step, "gate", None)
        if gate is not None:
            gate.handing_back = self.control.handing_back
