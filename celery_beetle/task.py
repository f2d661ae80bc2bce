"""``BeetleTask``: the opt-in base class for tasks that must run exactly once.

.. code-block:: python

    app = Celery(broker="beetle://guest:guest@rabbit1:5672,rabbit2:5672//")
    app.conf.beetle_redis_url = "redis://redis:6379/0"
    celery_beetle.install(app)

    @app.task(base=BeetleTask, timeout=60, attempts=3, exceptions=2, delay=5, max_delay=300,
              retry_on=(ConnectionError,))
    def charge(order_id): ...

Publishing (:meth:`BeetleTask.apply_async`) marks the message redundant (header
``x-beetle-flags: 1``), so the ``beetle://`` transport writes it to two brokers, and makes the
Celery task id its AMQP ``message_id``: the dedup identity is the logical task, and publishing
the same task id again (an outbox relay, a client retry after a lost reply) is a duplicate.
``redundant=False`` (on the task, or per call) publishes one copy, still deduplicated.

Running: the worker's gate (:mod:`celery_beetle.gate`) drops copies that already ran; in the
pool, :class:`_Run` claims the message before the body runs and records the
outcome after. Called directly, or eagerly, the body just runs.

Options (each also an app-wide default ``beetle_default_<name>``; see
:mod:`celery_beetle.settings`):

================  ======================================================================
``timeout``       lease per run, seconds. The task's hard time limit is derived from it
                  (``timeout - margin``, the soft limit one margin earlier; margin = 10 %
                  of the lease, 0.5 to 10 s) so that a run is killed before its lease ends
                  and two runs never overlap. A smaller ``time_limit`` is kept. The solo
                  and threads pools cannot enforce time limits.
``attempts``      most runs of one message, crashes included
``exceptions``    exceptions tolerated (retried) before giving up
``delay``         wait before the first retry, seconds; doubles per failure. Celery's
                  ``Task.delay()`` is a method, so the option is stored as
                  ``retry_delay`` (``@app.task(base=BeetleTask, delay=5)`` still works: the
                  value is moved there and ``.delay()`` keeps working)
``max_delay``     cap on that wait, seconds
``retry_on``      exception classes (or dotted names) worth a retry; others give up at once
``redundant``     publish two copies (default True)
================  ======================================================================

Acks: BeetleTask acks late (after the run), requeues when its pool process dies
(``reject_on_worker_lost``) or hits the hard time limit (``acks_on_timeout = False``): the
copy then waits in the gate until the lease runs out and the next claim decides.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from celery_beetle.deadletter import dead_letter_headers, publish_dead_letter
from celery_beetle.gate import FACTS_HEADER, facts_from_headers, message_facts
from celery_beetle.outcome import Claim, Failure, FailureDecision, GiveUpReason, Limits
from celery_beetle.redis_health import STORE_ERRORS, call_until_stored
from celery_beetle.retry_queue import RawMessage, publish_delayed, raw_message_from_request
from celery_beetle.settings import BeetleSettings
from celery_beetle.state import MessageFacts, State, Status
from celery_beetle.store import RedisStore, wall_clock_ms
from kombu_beetle.envelope import FLAG_REDUNDANT, FLAGS_HEADER
from kombu_beetle.trace import get_tracer

__all__ = [
    "AttemptsExhausted",
    "BeetleTask",
    "is_beetle_task",
    "message_id_for",
    "resolve_settings",
    "time_limits_for",
]

logger = logging.getLogger(__name__)

#: task attribute -> BeetleSettings.with_options() name
OPTION_ATTRIBUTES: dict[str, str] = {
    "timeout": "timeout",
    "attempts": "attempts",
    "exceptions": "exceptions",
    "retry_delay": "delay",
    "max_delay": "max_delay",
    "retry_on": "retry_on",
}


class BeetleTask(Task):
    """A Celery task that runs once per logical message, whatever the copies and crashes."""

    acks_late = True
    reject_on_worker_lost = True
    acks_on_timeout = False
    #: tells the gate which runs completed (see :class:`~celery_beetle.bootstep.BeetleRequest`)
    Request = "celery_beetle.bootstep:BeetleRequest"

    #: the design's options; None = the app-wide default
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
        # @app.task(base=BeetleTask, delay=5) builds a subclass with delay=5, shadowing
        # Task.delay(); move the number to retry_delay and let the method show through.
        if "delay" in cls.__dict__ and not callable(cls.__dict__["delay"]):
            value = cls.__dict__["delay"]
            delattr(cls, "delay")
            if value is not None:
                cls.retry_delay = value

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
        ``redundant=False``) and makes ``message_id`` the task id."""
        redundant = options.pop("redundant", None)
        if redundant is None:
            redundant = self.redundant
        if not self.app.conf.task_always_eager:
            from celery.utils import uuid

            task_id = task_id or uuid()
            headers = dict(options.pop("headers", None) or {})
            if redundant:
                headers[FLAGS_HEADER] = _int(headers.get(FLAGS_HEADER)) | FLAG_REDUNDANT
            options["headers"] = headers
            options.setdefault("message_id", message_id_for(task_id, options.get("retries")))
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
        return _Run(self, request).execute(args, kwargs)


def is_beetle_task(task: Any) -> bool:
    return isinstance(task, BeetleTask)


def resolve_settings(task: Any, app_settings: BeetleSettings) -> BeetleSettings:
    """``app_settings`` with the task's options over them; a clear error names the task."""
    options = {name: getattr(task, attr, None) for attr, name in OPTION_ATTRIBUTES.items()}
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


def message_id_for(task_id: str, retries: Any = None) -> str:
    """The ``message_id`` of a task message: its task id, so a republish dedups.

    A Celery ``self.retry()`` republishes under the same task id; it is a new message (the
    design: "a Celery retry() is a new publish"), so it gets a suffix, the same one every
    time that retry is published."""
    if retries:
        return f"{task_id}:retry-{int(retries)}"
    return task_id


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


class AttemptsExhausted(Exception):
    """The message started ``attempts`` times (crashed runs included) and never completed;
    it was dead-lettered. The result backend records this as the task's failure."""


class LeaseLost(Exception):
    """Another worker took the message over after this run's lease ran out."""


_stores: dict[tuple[Any, ...], RedisStore] = {}


def process_store(settings: BeetleSettings) -> RedisStore:
    """This process's store: pool processes must not share a parent's Redis sockets."""
    key = (os.getpid(), settings.redis_url, settings.key_prefix, settings.key_ttl_margin_ms)
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = RedisStore.from_settings(settings)
    return store


def request_facts(request: Any, settings: BeetleSettings) -> MessageFacts:
    """The dedup identity of the running message: what the gate found, or (no gate
    installed) the same rules applied to what the request carries."""
    facts = facts_from_headers(getattr(request, FACTS_HEADER, None))
    if facts is not None:
        return facts
    properties = getattr(request, "properties", None) or {}
    queue = (request.delivery_info or {}).get("routing_key") or "celery"
    message_id = properties.get("message_id") or request.id
    headers = properties.get("application_headers") or {}
    return message_facts(queue, str(message_id), headers, settings.message_ttl_ms, wall_clock_ms())


class _Run:
    """One run of a BeetleTask body in the pool: claim, run, then complete or fail.

    Control flow goes back to Celery as its own exceptions, which decide the ack:
    ``Ignore`` (ack, no result: a duplicate, an expired message, a lease taken over),
    ``Reject(requeue=True)`` (not now: locked, delayed, Redis down; the gate defers the
    redelivered copy), ``Retry`` (acked, state RETRY, the message is in its delay queue),
    the body's own exception (acked, state FAILURE, the message is dead-lettered).
    """

    def __init__(self, task: BeetleTask, request: Any) -> None:
        self.task = task
        self.request = request
        self.settings = task.beetle_settings
        self.limits = self.settings.limits
        self.facts = request_facts(request, self.settings)
        self.store = process_store(self.settings)
        self.tracer = get_tracer(self.settings.trace_dir, role="worker")
        host = getattr(request, "hostname", None) or socket.gethostname()
        self.owner = f"{host}:{os.getpid()}"
        facts_header = getattr(request, FACTS_HEADER, None) or {}
        self.broker = facts_header.get("broker") if isinstance(facts_header, dict) else None
        self.token = 0
        self.attempt = 0

    def execute(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._claim()
        self._trace("started")
        started = time.monotonic()
        try:
            result = self.task.run(*args, **kwargs)
        except (Retry, Ignore):
            # the body's own control flow: a Celery retry() is a new message, already sent
            self._complete(started)
            raise
        except Reject as exc:
            if exc.requeue:
                call_until_stored(lambda _: self.store.release(self.facts, self.token), "a release")
            else:
                self._complete(started)
            raise
        except Exception as exc:
            replacement = self._failed(exc)
            if replacement is None:
                raise
            raise replacement from exc
        if not self._complete(started):
            raise Ignore()
        return result

    # -- before ----------------------------------------------------------------------------

    def _claim(self) -> None:
        try:
            claim = self.store.claim(self.facts, self.limits, self.owner)
        except STORE_ERRORS as exc:
            logger.warning("beetle: cannot claim %s (%r); handing it back", self._name(), exc)
            raise Reject(f"dedup store unreachable: {exc!r}", requeue=True) from exc
        outcome = claim.outcome
        if outcome is Claim.ACQUIRED:
            self.token, self.attempt = claim.token, claim.attempt
            return
        if outcome is Claim.ALREADY_DONE:
            self._trace("duplicate", status=claim.status.value if claim.status else None)
            raise Ignore()
        if outcome is Claim.EXPIRED:
            self._trace("expired")
            raise Ignore()
        if outcome in (Claim.LOCKED, Claim.DELAYED):
            # another worker claimed it since the gate looked: hand the copy back, the gate
            # defers it until that lease ends or the retry is due
            raise Reject(f"{outcome.value} for {claim.delay_ms} ms", requeue=True)
        self.attempt = claim.attempt
        exhausted = AttemptsExhausted(
            f"{self._name()} started {claim.attempt} time(s) without completing "
            f"(attempts={self.limits.attempts}); dead-lettered"
        )
        self._dead_letter(GiveUpReason.ATTEMPTS_LIMIT.value, exhausted, claim.attempt, None)
        raise exhausted

    # -- after -----------------------------------------------------------------------------

    def _complete(self, started: float) -> bool:
        fence = call_until_stored(
            lambda _: self.store.complete(self.facts, self.token),
            f"the completion of {self._name()}",
        )
        if fence.ok:
            self._trace("completed", runtime_ms=round((time.monotonic() - started) * 1000))
            return True
        logger.warning(
            "beetle: late completion of %s refused: its lease ran out and another run took it "
            "over (stored status %s, token %s; this run held token %s)",
            self._name(),
            fence.status.value if fence.status else None,
            fence.token,
            self.token,
        )
        return False

    def _failed(self, exc: Exception) -> BaseException | None:
        """Record the failure; return what to raise instead of ``exc`` (None: ``exc``)."""
        retryable = self.settings.is_retryable(exc)
        decision = call_until_stored(
            lambda number: self._fail_once(number, retryable), f"the failure of {self._name()}"
        )
        self._trace("failed", exc=f"{type(exc).__name__}: {exc}"[:300])
        if decision.outcome is Failure.NOT_OWNER:
            logger.warning("beetle: failure of %s not recorded: lease taken over", self._name())
            return Ignore()
        if decision.outcome is Failure.GIVE_UP:
            reason = decision.reason.value if decision.reason else "unknown"
            self._dead_letter(reason, exc, decision.attempts, decision.exceptions)
            return None
        try:
            with self.task.app.producer_or_acquire() as producer:
                publish_delayed(producer, self._raw_message(), self.facts.queue, decision.delay_ms)
        except Exception as pub_exc:
            # the record says "retry at T"; the copy goes back and the gate defers it to T
            logger.error("beetle: cannot publish the retry of %s (%r)", self._name(), pub_exc)
            return Reject(f"retry not published: {pub_exc!r}", requeue=True)
        self._trace("retried", delay_s=decision.delay_ms / 1000)
        return Retry(exc=exc, when=decision.delay_ms / 1000)

    def _fail_once(self, number: int, retryable: bool) -> FailureDecision:
        if number > 0:  # a reply may have been lost: was an earlier try applied?
            state = self.store.peek(self.facts.queue, self.facts.message_id)
            applied = _applied_failure(state, self.token, retryable, self.limits, wall_clock_ms())
            if applied is not None:
                return applied
        return self.store.fail(self.facts, self.token, self.limits, retryable)

    def _dead_letter(
        self, reason: str, exc: BaseException, attempts: int | None, exceptions: int | None
    ) -> None:
        headers = dead_letter_headers(
            reason,
            self.facts.queue,
            exc,
            attempts=attempts,
            exceptions=exceptions,
            worker=self.owner,
        )
        try:
            with self.task.app.producer_or_acquire() as producer:
                publish_dead_letter(producer, self._raw_message(), self.facts.queue, headers)
        except Exception as pub_exc:
            logger.error("beetle: could not dead-letter %s (%s): %r", self._name(), reason, pub_exc)
            return
        self._trace("dead_lettered", reason=reason)

    # -- helpers ---------------------------------------------------------------------------

    def _raw_message(self) -> RawMessage:
        return raw_message_from_request(self.request, self.task.name, self.facts.message_id)

    def _name(self) -> str:
        return f"{self.task.name}[{self.request.id}] ({self.facts.queue}, {self.facts.message_id})"

    def _trace(self, event: str, **detail: Any) -> None:
        if not getattr(self.tracer, "enabled", False):
            return
        self.tracer.emit(
            event,
            self.facts.message_id,
            queue=self.facts.queue,
            task_name=self.task.name,
            task_id=self.request.id,
            broker=self.broker,
            worker=getattr(self.request, "hostname", None),
            attempt=self.attempt or None,
            detail=detail or None,
        )


def _applied_failure(
    state: State | None, token: int, retryable: bool, limits: Limits, now_ms: int
) -> FailureDecision | None:
    """If ``state`` shows our failure already recorded, the decision it recorded; None if
    the record still waits for it (running under our token)."""
    if state is not None and state.status is Status.RUNNING and state.token == token:
        return None
    if state is None or state.token != token:
        return FailureDecision(Failure.NOT_OWNER)
    if state.status is Status.PENDING:
        return FailureDecision(
            Failure.RETRY,
            delay_ms=max(state.retry_not_before_ms - now_ms, 0),
            retry_not_before_ms=state.retry_not_before_ms,
            attempts=state.attempts,
            exceptions=state.exceptions,
        )
    if state.status is Status.FAILED:
        if not retryable:
            reason = GiveUpReason.NOT_RETRYABLE
        elif state.attempts >= limits.attempts:
            reason = GiveUpReason.ATTEMPTS_LIMIT
        else:
            reason = GiveUpReason.EXCEPTIONS_LIMIT
        return FailureDecision(
            Failure.GIVE_UP, reason=reason, attempts=state.attempts, exceptions=state.exceptions
        )
    return FailureDecision(Failure.NOT_OWNER)
