"""``BeetleTask``: the opt-in base class for tasks that must run exactly once.

.. code-block:: python

    app = Celery(broker="beetle://guest:guest@rabbit1:5672,rabbit2:5672//")
    app.conf.beetle_redis_url = "redis://redis:6379/0"
    celery_beetle.install(app)

    @app.task(base=BeetleTask, timeout=60, attempts=3, exceptions=2, retry_delay=5,
              max_delay=300, retry_on=(ConnectionError,))
    def charge(order_id): ...

Publishing (:meth:`BeetleTask.apply_async`) marks the message redundant (header
``x-beetle-flags: 1``), so the ``beetle://`` transport writes it to two brokers, and gives it
an AMQP ``message_id`` of its own (:mod:`celery_beetle.message_ids`): a message is a publish,
not a task id, so applying one frozen signature twice runs twice, while the two copies of one
publish, or a run's republish after a crash, run once. A caller's ``message_id`` (an
idempotency key) is kept: publishing it again is a duplicate.
``redundant=False`` (on the task, or per call) publishes one copy, still deduplicated.

Running: the worker's gate (:mod:`celery_beetle.worker.gate`) drops copies that already ran; in the
pool, :class:`~celery_beetle.worker.run.Run` claims the message before the body runs and records the
outcome after. Called directly, or eagerly, the body just runs.

Options (the names of :data:`celery_beetle.settings.TASK_OPTIONS`, set as task attributes;
each also an app-wide default ``beetle_default_<name>``; see :mod:`celery_beetle.settings`):

================  ======================================================================
``timeout``       lease per run, seconds. The task's hard time limit is derived from it
                  (``timeout - margin``, the soft limit one margin earlier; margin = 10 %
                  of the lease, 0.5 to 10 s) so that a run is killed before its lease ends
                  and two runs never overlap. A smaller ``time_limit`` is kept. The solo
                  and threads pools cannot enforce time limits.
``attempts``      most runs of one message, crashes included
``exceptions``    exceptions tolerated (retried) before giving up
``retry_delay``   wait before the first retry, seconds; doubles per failure. ``delay``
                  is its deprecated alias: ``@app.task(base=BeetleTask, delay=5)`` warns,
                  the value is moved to ``retry_delay`` and Celery's ``.delay()`` method
                  keeps working
``max_delay``     cap on that wait, seconds
``retry_on``      exception classes (or dotted names) worth a retry; others give up at once
``redundant``     publish two copies (default True)
================  ======================================================================

Acks: BeetleTask acks late (after the run), requeues when its pool process dies
(``reject_on_worker_lost``) or hits the hard time limit (``acks_on_timeout = False``): the
copy then waits in the gate until the lease runs out and the next claim decides.

Celery's ack options, as BeetleTask takes them (:data:`ACK_RULES`):

- ``acks_late=False`` works: Celery acks the copy as a pool process takes it, so the run
  stores its own completion (one more round trip in the pool) instead of the gate before
  the ack. A worker killed mid-body then leaves only the other copy, which the lease's end
  hands to the next claim as for any crash.
- ``acks_on_failure_or_timeout``, ``acks_on_failure``, ``acks_on_timeout``,
  ``reject_on_worker_lost`` and ``retry_on_worker_lost`` are BeetleTask's own: a failure is
  retried or dead-lettered by the run itself (a Celery reject would add a second, broker-made
  dead letter), and a copy whose body was cut short must go back to its queue (an ack would
  drop a message whose outcome is not stored; Celery's retry would run it again as a new
  message). Setting one of them on a BeetleTask is refused where the task is declared; the
  app-wide ``task_*`` settings of the same names apply to plain tasks only.
- ``worker_prefetch_multiplier = 0`` (no limit) works: every delivery the gate claims holds
  a reservation, renewed while it waits.

:May import: ``kombu_beetle``, ``celery_beetle.settings``, ``celery_beetle.worker``,
    ``celery_beetle.message_ids``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``, ``celery_beetle.metrics``, ``celery_beetle.censor``
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from billiard.exceptions import TimeLimitExceeded
from celery import Task
from celery.signals import before_task_publish
from celery.worker.request import Request

from celery_beetle.message_ids import message_id_for, publish_message_id
from celery_beetle.settings import DEPRECATED_OPTIONS, TASK_OPTIONS, BeetleSettings, take_deprecated
from celery_beetle.worker.errors import AttemptsExhausted, DeadLettered, Dropped, HandBack
from celery_beetle.worker.facts import (
    COMPLETED_MARK,
    FACTS_HEADER,
    HANDBACK_MARK,
    PID_MARK,
    RUNTIME_MARK,
)
from celery_beetle.worker.run import Run
from celery_beetle.worker.run_state import completed_on_the_loop, refused_completion
from celery_beetle.worker.runnable import is_beetle_task
from kombu_beetle.envelope import FLAG_REDUNDANT, FLAGS_HEADER

__all__ = [
    "ACK_RULES",
    "DROPPED_EVENT",
    "AttemptsExhausted",
    "BeetleRequest",
    "BeetleTask",
    "DeadLettered",
    "is_beetle_task",
    "message_id_for",
    "resolve_settings",
    "time_limits_for",
]

logger = logging.getLogger(__name__)

#: Celery ack options a BeetleTask keeps as they are, and why one may not be changed.
ACK_RULES: dict[str, tuple[bool, str]] = {
    "acks_on_failure_or_timeout": (
        True,
        "a failed BeetleTask is retried or dead-lettered by its run (to <queue>.dead, once); "
        "Celery's reject would add a second, broker-made dead letter",
    ),
    "acks_on_failure": (
        True,
        "a failed BeetleTask is retried or dead-lettered by its run (to <queue>.dead, once); "
        "Celery's reject would add a second, broker-made dead letter",
    ),
    "acks_on_timeout": (
        False,
        "a body the hard time limit ended has no outcome stored: its copy must go back to "
        "its queue for the next claim to decide, not be acked away",
    ),
    "reject_on_worker_lost": (
        True,
        "a body whose pool process died has no outcome stored: its copy must go back to its "
        "queue for the next claim to decide, not be acked away",
    ),
    "retry_on_worker_lost": (
        False,
        "Celery's retry after a lost worker is a new message that would run the body again; "
        "BeetleTask's `attempts` decides whether a body that began runs again",
    ),
}


def _check_ack_options(namespace: dict[str, Any]) -> None:
    """Refuse, where a BeetleTask is declared, a Celery ack option it cannot honour."""
    for name, (kept, why) in ACK_RULES.items():
        if name in namespace and namespace[name] is not None and namespace[name] != kept:
            task = namespace.get("name") or namespace.get("__qualname__", "?")
            raise ValueError(
                f"task {task!r}: {name}={namespace[name]!r} is not supported on a BeetleTask "
                f"(it keeps {name}={kept}): {why}. Remove the option"
            )


class BeetleTask(Task):
    """A Celery task that runs once per logical message, whatever the copies and crashes."""

    acks_late = True
    # set here, not from the app's task_* settings: see ACK_RULES
    acks_on_failure_or_timeout = True
    acks_on_failure = True
    acks_on_timeout = False
    reject_on_worker_lost = True
    retry_on_worker_lost = False
    #: tells the gate which runs completed (see ``celery_beetle.task.BeetleRequest``)
    Request = "celery_beetle.task:BeetleRequest"

    #: the options of :data:`~celery_beetle.settings.TASK_OPTIONS`; None = the app-wide default
    timeout: float | None = None
    attempts: int | None = None
    exceptions: int | None = None
    retry_delay: float | None = None
    max_delay: float | None = None
    retry_on: Any = None
    redundant: bool = True

    _beetle_settings: BeetleSettings | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_ack_options(dict(cls.__dict__))
        # @app.task(base=BeetleTask, delay=5) builds a subclass with delay=5, shadowing
        # Task.delay(); move the number to retry_delay (warning) and let the method show through.
        for old, new in DEPRECATED_OPTIONS.items():
            if old in cls.__dict__ and not callable(cls.__dict__[old]):
                try:
                    value = take_deprecated(cls.__dict__, old, new, cls.__dict__[old])
                except ValueError as exc:
                    raise ValueError(f"task {cls.__dict__.get('name', cls)!r}: {exc}") from None
                delattr(cls, old)
                if value is not None:
                    setattr(cls, new, value)

    # -- settings --------------------------------------------------------------------------

    @property
    def beetle_settings(self) -> BeetleSettings:
        """The app's settings with this task's options over them (validated once)."""
        if self._beetle_settings is None:
            self._beetle_settings = resolve_settings(self, BeetleSettings.from_app(self.app))
        return self._beetle_settings

    def apply_beetle_time_limits(self) -> None:
        """Derive the time limits from the lease (the worker calls this at start)."""
        current = (getattr(self, "time_limit", None), getattr(self, "soft_time_limit", None))
        hard, soft = time_limits_for(self.beetle_settings.lease_timeout_s, *current)
        self.time_limit, self.soft_time_limit = hard, soft

    # -- publishing ------------------------------------------------------------------------

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        **options: Any,
    ) -> Any:
        """Celery's ``apply_async``; also marks the message redundant (unless
        ``redundant=False``) and gives it its ``message_id`` (:mod:`celery_beetle.message_ids`)."""
        redundant = options.pop("redundant", None)
        if redundant is None:
            redundant = self.redundant
        if not self.app.conf.task_always_eager:
            from celery.utils import uuid

            headers = dict(options.pop("headers", None) or {})
            if redundant:
                headers[FLAGS_HEADER] = _int(headers.get(FLAGS_HEADER)) | FLAG_REDUNDANT
            options["headers"] = headers
            if not options.get("message_id"):
                options["message_id"] = publish_message_id(self.app, task_id, options)
                task_id = task_id or options["message_id"]  # a new task: one id for both
            task_id = task_id or uuid()
        publishing = _publishing.set(True)
        try:
            return super().apply_async(
                args,
                kwargs,
                task_id=task_id,
                producer=producer,
                link=link,
                link_error=link_error,
                shadow=shadow,
                **options,
            )
        finally:
            _publishing.reset(publishing)

    # -- running ---------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        if (
            request is None
            or request.called_directly
            or request.is_eager
            or not request.delivery_info
        ):
            return super().__call__(*args, **kwargs)
        return Run(self, request).execute(args, kwargs)


#: True while :meth:`BeetleTask.apply_async` publishes (see :func:`_no_broker_expiry`)
_publishing: ContextVar[bool] = ContextVar("beetle_publishing", default=False)


def _no_broker_expiry(sender: Any = None, properties: Any = None, **kwargs: Any) -> None:
    """Publish a BeetleTask's message without the AMQP ``expiration`` Celery derives from
    ``expires``, so that its worker, not a broker, decides its expiry.

    A broker discards an expired message unseen: nobody stores ``REVOKED``, and the
    caller's ``get()`` waits forever. A BeetleTask acks late, so a message that waits behind
    a full prefetch window (its worker busy) is still in its queue when it expires. Without
    the property it is delivered, and the worker revokes it as Celery's does (Celery's
    ``expires`` header): ``REVOKED`` stored once, by the copy that decided it.
    """
    if _publishing.get() and isinstance(properties, dict):
        properties.pop("expiration", None)


before_task_publish.connect(_no_broker_expiry, weak=False, dispatch_uid="beetle_no_broker_expiry")


#: The Celery event a copy dropped at the pool's claim gets (fields: ``uuid``, ``reason``:
#: ``duplicate`` or ``expired``); a copy dropped by the gate never becomes a Celery request
#: and sends no event at all (README: "Celery events").
DROPPED_EVENT = "task-beetle-dropped"


class BeetleRequest(Request):
    """Celery's request, telling the gate when a run completed (BeetleTask's ``Request``).

    The gate holds the second copy of a message while the first runs on this worker. When
    the first is acked after a successful run, the record is completed (the pool stored it
    before returning), so the second copy can be dropped without reading Redis. Celery acks
    through ``acknowledge()`` on every path; only success gets there without passing
    ``on_failure``, ``on_retry``, a hard ``on_timeout`` or ``_announce_revoked``, which
    mark the run as not completed. The mark goes into the gate's header of the delivery.

    A run the pool handed back (:class:`~celery_beetle.worker.errors.HandBack`) is marked
    too, so that the gate requeues it after a backoff rather than at once. A copy the pool's
    claim dropped (:class:`~celery_beetle.worker.errors.Dropped`) gets a
    :data:`DROPPED_EVENT` event.

    When the gate claimed the message, the mark is what makes the gate store the completion
    before the ack (:meth:`~celery_beetle.worker.gate.DeliveryGate.complete_before_ack`): the
    pool left it to the main process.
    """

    _beetle_not_completed = False
    _beetle_timed_out = False

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        self._beetle_not_completed = True
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback
        if isinstance(exc, HandBack):  # tell the gate to requeue it after a backoff
            facts = (self.message.headers or {}).get(FACTS_HEADER)
            if isinstance(facts, dict):
                facts[HANDBACK_MARK] = exc.mark()
        elif isinstance(exc, Dropped):  # close Celery's received/started: not a run
            self.send_event(DROPPED_EVENT, reason=exc.reason)
        elif isinstance(exc, TimeLimitExceeded):
            return self._handing_back(super().on_failure, exc_info, *args, **kwargs)
        return super().on_failure(exc_info, *args, **kwargs)

    def on_retry(self, *args: Any, **kwargs: Any) -> Any:
        self._beetle_not_completed = True
        return super().on_retry(*args, **kwargs)

    def on_timeout(self, soft: bool, timeout: float) -> Any:
        if soft:
            return super().on_timeout(soft, timeout)
        self._beetle_not_completed = True
        return self._handing_back(super().on_timeout, soft, timeout)

    def _handing_back(self, handler: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run Celery's ``handler`` of a hard time limit with its ack made a hand-back.

        Celery before 5.7 has no ``acks_on_timeout`` and acks a body its hard time limit
        ended, so a message with no twin would be gone. The copy goes back to its queue
        instead, as on Celery 5.7, for the next claim to decide (a retry or a dead letter).
        """
        self._beetle_timed_out = True
        try:
            return handler(*args, **kwargs)
        finally:
            self._beetle_timed_out = False

    def _announce_revoked(self, *args: Any, **kwargs: Any) -> Any:
        # expired or revoked: decided here, once. Celery stores REVOKED and acks; the mark
        # makes the gate settle the record before that ack, so the twin copy is dropped as
        # a duplicate rather than revoked (and REVOKED stored) a second time
        self._beetle_not_completed = True
        facts = (self.message.headers or {}).get(FACTS_HEADER)
        if isinstance(facts, dict):
            facts[COMPLETED_MARK] = True
        return super()._announce_revoked(*args, **kwargs)

    def acknowledge(self) -> None:
        if self._beetle_timed_out:  # see on_timeout
            self.reject(requeue=True)
            return
        # an early ack (acks_late turned off) comes before the run: it proves nothing
        if refused_completion(self.id):
            pass  # its completion was refused after Celery's success: another run has it
        elif completed_on_the_loop(self.id):
            pass  # the run (solo, gevent, eventlet) stored its completion itself
        elif not self.acknowledged and not self._beetle_not_completed and self.task.acks_late:
            facts = (self.message.headers or {}).get(FACTS_HEADER)
            if isinstance(facts, dict):
                facts[COMPLETED_MARK] = True
                if self.time_start:  # when the pool accepted it (wall clock)
                    facts[RUNTIME_MARK] = round((time.time() - self.time_start) * 1000)
                if self.worker_pid:  # the run's process, named by the ``completed`` event
                    facts[PID_MARK] = self.worker_pid
        super().acknowledge()


def resolve_settings(task: Any, app_settings: BeetleSettings) -> BeetleSettings:
    """``app_settings`` with the task's options over them; a clear error names the task."""
    options = {name: getattr(task, name, None) for name in TASK_OPTIONS}
    try:
        return app_settings.with_options(**options)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"task {getattr(task, 'name', task)!r}: {exc}") from None


def time_limits_for(
    lease_s: float, time_limit: float | None = None, soft_time_limit: float | None = None
) -> tuple[float, float]:
    """(hard, soft) time limits that end a run before its lease does.

    The margin (10 % of the lease, between 0.5 and 10 s) covers the claim, the completion
    and the clock skew between workers. A smaller limit the task set itself is kept.
    """
    margin = min(max(lease_s * 0.1, 0.5), 10.0)
    hard = max(lease_s - margin, lease_s / 2)
    soft = max(hard - margin, hard / 2)
    if time_limit:
        hard = min(hard, float(time_limit))
    if soft_time_limit:
        soft = min(soft, float(soft_time_limit))
    return hard, min(soft, hard)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
