"""What the gate bootstep hands the gate and the worker: small named callables.

Each one answers a question the gate asks of the worker around it (which limits a task
claims with, whether a pool process is free, when to call back), or one the worker asks
of the gate (is this raw delivery a twin to hold, what to do with an unknown task).
They hold what they need from their constructors, so the gate never sees Celery's
consumer object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.exceptions import NotRegistered
from celery.utils.objects import Bunch

from celery_beetle.store.outcome import Limits
from celery_beetle.worker.runnable import is_beetle_task

if TYPE_CHECKING:
    from celery_beetle.worker.gate import DeliveryGate

__all__ = [
    "ClaimLimits",
    "PreforkFree",
    "TwinFilter",
    "UnknownTaskHandler",
    "WorkerTimer",
    "no_claims",
    "pool_free_for",
]

logger = logging.getLogger(__name__)


class WorkerTimer:
    """``call_later(seconds, fn)`` on the worker's event loop (now: its next turn) or, without
    one (the solo pool's blocking loop), on its timer thread."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer

    def __call__(self, seconds: float, fn: Callable[[], None]) -> Any:
        hub = getattr(self.consumer, "hub", None)
        if seconds <= 0 and hub is not None:
            return hub.call_soon(fn)
        return self.consumer.timer.call_after(max(seconds, 0.0), fn)


class ClaimLimits:
    """The limits the gate claims a BeetleTask delivery with, in its batch; None for a plain
    task, and for one with an ETA: Celery holds it in the main process until then, and the
    pool claims it when it runs, so no lease runs out while it waits."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.by_task: dict[str, Limits] = {}

    def __call__(self, message: Any, task_name: str) -> Limits | None:
        if (message.headers or {}).get("eta"):
            return None
        found = self.by_task.get(task_name)
        if found is None:
            task = self.app.tasks.get(task_name)
            if not is_beetle_task(task):
                return None
            found = self.by_task[task_name] = task.beetle_settings.limits
        return found


def no_claims(message: Any, task_name: str) -> None:
    """The gate claims nothing itself (synchronous reads, or writes that wait for replicas):
    the pool claims each delivery as it runs."""
    return None


class PreforkFree:
    """How many of the prefork pool's processes are free: its processes less the requests
    handed to it (Celery counts a request reserved from the strategy's hand-over until its
    result is back, so those processes are free for sure); 0 while the pool is stopped.

    :meth:`takes` says which tasks the gate claims in full for a free process: not one with
    a rate limit, which Celery holds in a token bucket before it reserves the request, so
    a lease and an attempt would begin long before the body."""

    def __init__(self, pool: Any, reserved: Any, app: Any = None) -> None:
        self.pool = pool
        self.reserved = reserved
        self.app = app
        self._rate_limited: dict[str, bool] = {}

    def __call__(self) -> int:
        processes = getattr(getattr(self.pool, "_pool", None), "_processes", None)  # None: stopped
        return max(0, processes - len(self.reserved)) if isinstance(processes, int) else 0

    def takes(self, task_name: str) -> bool:
        limited = self._rate_limited.get(task_name)
        if limited is None:
            task = self.app.tasks.get(task_name) if self.app is not None else None
            limited = self._rate_limited[task_name] = bool(getattr(task, "rate_limit", None))
        return not limited


def pool_free_for(consumer: Any) -> PreforkFree | None:
    """:class:`PreforkFree` for a prefork pool; None for any other (its bodies run on the
    worker's event loop or its threads, and the gate claims first)."""
    from celery.concurrency.prefork import TaskPool
    from celery.worker import state

    pool = getattr(consumer, "pool", None)
    if not isinstance(pool, TaskPool):
        return None
    return PreforkFree(pool, state.reserved_requests, getattr(consumer, "app", None))


class TwinFilter:
    """The ``beetle://`` connection's delivery filter: a raw delivery of a gated task goes to
    the gate before kombu makes a Message of it, so that the second copy of a message
    already running here costs almost nothing."""

    def __init__(self, gate: DeliveryGate, gated: frozenset[str]) -> None:
        self.gate = gate
        self.gated = gated

    def __call__(self, raw: Any, tag: str, deliver: Callable[[Any], Any]) -> bool:
        headers = raw.properties.get("application_headers")
        task_name = headers.get("task") if isinstance(headers, dict) else None
        if task_name not in self.gated:
            return False
        return self.gate.hold_twin(raw, task_name, deliver)


class UnknownTaskHandler:
    """Celery's ``on_unknown_task``, through the gate: a message naming a task this worker
    does not know is handed back for a grace period (a deploy may be under way), then
    dead-lettered once, with a FAILURE recorded for its caller."""

    def __init__(
        self,
        app: Any,
        gate: Callable[[], DeliveryGate | None],
        original: Callable[[Any, Any, Any], None],
    ) -> None:
        self.app = app
        self.gate = gate
        self.original = original

    def __call__(self, body: Any, message: Any, exc: Any) -> None:
        gate = self.gate()
        if gate is None:
            self.original(body, message, exc)
            return
        name = str((message.headers or {}).get("task") or "?")
        if gate.unknown_task(message, name, repr(exc)) == "bad_input":
            record_unknown_task(self.app, message, name)


def record_unknown_task(app: Any, message: Any, name: str) -> None:
    """What Celery records for an unknown task, once it is dead-lettered: a FAILURE in the
    result backend (best effort: the dead letter is what counts)."""
    headers = message.headers or {}
    task_id = headers.get("id")
    if not task_id:
        return
    request = Bunch(
        name=name,
        chord=None,
        root_id=headers.get("root_id"),
        correlation_id=(message.properties or {}).get("correlation_id"),
        reply_to=(message.properties or {}).get("reply_to"),
        errbacks=None,
    )
    try:
        app.backend.mark_as_failure(task_id, NotRegistered(name), request=request)
    except Exception as exc:
        logger.debug("beetle: cannot record unknown task %s: %r", task_id, exc)
