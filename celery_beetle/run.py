"""One run of a BeetleTask body in a pool process: claim, run, then complete or fail.

:class:`Run` is what :meth:`BeetleTask.__call__` hands the body to. It costs two Redis round
trips (the claim script before the body, the complete or fail script after) and tells
Celery what to do with the delivery through Celery's own control-flow exceptions.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore, Reject, Retry

from celery_beetle.deadletter import dead_letter_headers, publish_dead_letter
from celery_beetle.facts import FACTS_HEADER, facts_from_headers, message_facts
from celery_beetle.outcome import Claim, Failure, FailureDecision, GiveUpReason, Limits
from celery_beetle.redis_health import STORE_ERRORS, call_until_stored
from celery_beetle.retry_queue import RawMessage, publish_delayed, raw_message_from_request
from celery_beetle.settings import BeetleSettings
from celery_beetle.state import MessageFacts, State, Status
from celery_beetle.store import RedisStore, wall_clock_ms
from kombu_beetle.trace import get_tracer

if TYPE_CHECKING:
    from celery_beetle.task import BeetleTask

__all__ = ["AttemptsExhausted", "LeaseLost", "Run", "process_store", "request_facts"]

logger = logging.getLogger(__name__)


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


class Run:
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
