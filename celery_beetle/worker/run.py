"""One run of a BeetleTask body in a pool process: claim, run, then complete or fail.

:class:`Run` is what :meth:`BeetleTask.__call__` hands the body to.
It tells Celery what to do with the delivery through Celery's own control-flow exceptions.
:doc:`/guides/gate-internals` tells a run's path at length.

Rules:

- The run's lease is taken before the body: the gate's reservation started, or a claim of
  its own (:class:`~.run_claim.RunClaim`).

- A body that succeeds on the gate's claim is completed by the gate, before its ack.
- The pool completes it here instead after an early ack (``acks_late=False``), on the
  worker's event loop (solo, gevent, eventlet), or when Celery fails a run whose body returned.
- A run with ``link`` callbacks or a chain's next link stores its completion as the task
  ends (:func:`~.run_state.owe_completion`), once Celery published them: a kill in between
  leaves the message to be taken over, never completed with its next link unsent.
- A completion or failure is retried until stored
  (:func:`~celery_beetle.store.health.call_until_stored`), at least every
  :data:`OUTCOME_RETRY_MAX_S`; under prefork the job's time limits wait for it
  (:func:`~.time_limits.storing_the_outcome`): a Redis outage shorter than the lease loses
  no outcome of a body that ended.
- A dead letter that cannot be published hands the copy back; the record keeps it owed.
- With ``acks_late`` off Celery acks the copy as the pool takes it, so a claim the store
  refused or deferred, or a completion that found no record, cannot hand it back: the run
  publishes the message again instead (:mod:`.send_back`).
- Where the pool cannot cut a body short, a :class:`~.lease.LeaseKeeper` extends its lease.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import replace
from typing import Any, NoReturn

from billiard.process import current_process
from celery.exceptions import Ignore, Reject, Retry

from celery_beetle import metrics
from celery_beetle.store.health import call_until_stored
from celery_beetle.store.outcome import Failure, GiveUpReason
from celery_beetle.store.state import MAX_OWNER_LENGTH
from celery_beetle.worker import run_state, time_limits
from celery_beetle.worker.deadletter import OwedDeadLetter
from celery_beetle.worker.errors import AttemptsExhausted, DeadLettered, Deferred, Dropped, HandBack
from celery_beetle.worker.facts import CLAIM_MARK, FACTS_HEADER, GateClaim
from celery_beetle.worker.lease import LeaseKeeper
from celery_beetle.worker.retry_queue import RawMessage, publish_delayed, raw_message_from_request
from celery_beetle.worker.run_calls import RetriedCalls
from celery_beetle.worker.run_claim import Lease, RunClaim
from celery_beetle.worker.run_state import completed_on_the_loop, mark_inbox
from celery_beetle.worker.runnable import (
    RunnableTask,
    is_beetle_task,
    process_store,
    request_facts,
)
from celery_beetle.worker.send_back import send_back
from kombu_beetle.trace import get_tracer

__all__ = [
    "OUTCOME_RETRY_MAX_S",
    "AttemptsExhausted",
    "DeadLettered",
    "HandBack",
    "Run",
    "RunnableTask",
    "completed_on_the_loop",
    "is_beetle_task",
    "mark_inbox",
    "process_store",
    "request_facts",
]

logger = logging.getLogger(__name__)

#: The longest pause between two tries of a completion or failure Redis did not take: once
#: Redis is back the outcome is stored within it (plus a try's own wait for a replica's ack
#: with ``beetle_redis_wait_replicas``), before the lease runs out and another copy claims.
OUTCOME_RETRY_MAX_S = 0.5


class Run:
    """One run of a BeetleTask body in the pool: claim, run, then complete or fail.

    Control flow goes back to Celery as its own exceptions, which decide the ack:
    ``Ignore`` (ack, no result: a duplicate, an expired message, a lease taken over),
    ``Reject(requeue=True)`` (not now: locked, delayed, Redis down; the gate defers the
    redelivered copy; or a completion that found no record, a Redis failover having lost
    the claim, so that the body runs again; sent back instead after an early ack),
    ``Retry`` (acked, state RETRY, the message is in its delay queue), the body's own
    exception (acked, state FAILURE, the message is dead-lettered).
    """

    def __init__(self, task: RunnableTask, request: Any) -> None:
        self.task = task
        self.request = request
        self.settings = task.beetle_settings
        self.limits = self.settings.limits
        self.facts = request_facts(request, self.settings)
        self.store = process_store(self.settings)
        self.tracer = get_tracer(self.settings.trace_dir, role="worker")
        host = getattr(request, "hostname", None) or socket.gethostname()
        self.worker = f"{host}:{os.getpid()}"
        facts_header = getattr(request, FACTS_HEADER, None)
        if not isinstance(facts_header, dict):
            facts_header = {}
        self.broker = facts_header.get("broker")
        #: the gate's claim for this delivery, if it made one
        self.given = GateClaim.from_mark(facts_header.get(CLAIM_MARK))
        #: the lease the body runs on; until it is taken, this run's own id in the store (a
        #: claim retried under it is recognised as ours)
        self.lease = Lease(f"{secrets.token_hex(4)}@{self.worker}"[:MAX_OWNER_LENGTH])
        self.started = 0.0
        #: a completion found no record at all: no other run took the message over
        self._record_lost = False
        #: the calls to the store before the body, retried under this run's owner
        self.calls = RetriedCalls(task, request, self._name())
        self.claim = RunClaim(
            self.store, self.facts, self.limits, self.calls,
            name=self._name(),
            acks_late=bool(getattr(task, "acks_late", True)),
            trace=self._trace,
            give_up=self._give_up,
        )  # fmt: skip
        self._inbox_marked = False
        #: the lease keeper of a body that returned, until its owed completion is stored
        self._keeper: LeaseKeeper | None = None

    def execute(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        run_state.left_to_main.pop(self.request.id, None)
        try:
            self.lease = self.claim.before_the_body(self.given, self.lease.owner)
        except (HandBack, Deferred) as exc:
            if self.claim.acks_late:
                raise  # the copy is unacked: the gate requeues or defers it
            self._send_back(exc)
            raise Dropped("sent back") from exc
        self._trace("started")
        self.started = started = time.monotonic()
        keeper = self._keep_lease()
        outer, run_state.running.run = getattr(run_state.running, "run", None), self
        try:
            result = self.task.run(*args, **kwargs)
        except BaseException as exc:
            if keeper is not None:
                keeper.stop()
            self._after_exception(exc, started)
            raise
        finally:
            run_state.running.run = outer
        metrics.task_runtime(self.facts.scope, self.task.name, time.monotonic() - started)
        if self.lease.gate_completes:
            if keeper is not None:
                keeper.stop()
            run_state.leave_to_main(self)
        elif self._sends_after_the_body():
            # Celery sends the callbacks and the chain's next link once this returns: the
            # completion waits for them (a worker killed between the two would leave a
            # completed message whose next link nobody sends), on the lease kept meanwhile
            time_limits.storing_the_outcome()
            self._keeper = keeper
            run_state.owe_completion(self)
        else:
            if keeper is not None:
                keeper.stop()
            if not self._complete(started):
                if self._record_lost:
                    self._give_back_unrecorded()
                raise Ignore()
            self._completed_here()
        return result

    def _sends_after_the_body(self) -> bool:
        """Whether Celery publishes something once the body returned: its ``link``
        callbacks, or the next link of its chain."""
        return bool(
            getattr(self.request, "callbacks", None) or getattr(self.request, "chain", None)
        )

    def complete_owed(self) -> None:
        """Store the completion this run owes, now that Celery sent what follows the body
        (:func:`~.run_state.owe_completion`). Too late to make Celery ignore the run: a
        completion refused (its lease taken over) tells the ack so where it can, and one
        that found no record sends its copy back, as Celery acks this one."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
        if self._complete(self.started, limits_held=True):
            self._completed_here()
        elif self._record_lost:
            self._send_back(HandBack("its record is gone from the store"))
        elif current_process().name == "MainProcess":  # a pool process cannot tell its parent
            run_state.refused_here.add(self.request.id)

    def _completed_here(self) -> None:
        if self.lease.token and run_state.on_the_event_loop():
            run_state.completed_here_on_the_loop.add(self.request.id)

    def _after_exception(self, exc: BaseException, started: float) -> None:
        """Store what the body's exception means; raise a replacement where Celery must see
        another control flow (returns when ``exc`` itself is the right one to raise)."""
        if isinstance(exc, (Retry, Ignore)):
            # the body's own control flow: a Celery retry() is a new message, already sent
            self._complete(started)
            return
        if isinstance(exc, Reject):
            if exc.requeue:
                call_until_stored(
                    lambda _: self.store.release(self.facts, self.lease.token), "a release"
                )
            else:
                self._complete(started)
            return
        if not isinstance(exc, Exception):
            return  # SystemExit, a hard time limit: the lease runs out, the gate decides
        replacement = self._failed(exc)
        if replacement is not None:
            raise replacement from exc

    # -- before ----------------------------------------------------------------------------

    def _keep_lease(self) -> LeaseKeeper | None:
        """A lease keeper where the pool cannot cut the body short (it runs in the worker's
        main process: solo, threads, gevent, eventlet); prefork's time limit does it there."""
        if current_process().name != "MainProcess":
            return None
        keeper = LeaseKeeper(
            self.store, self.facts, self.lease.token, self.limits.lease_timeout_ms,
            lease_deadline_ms=self.lease.deadline_ms,
        )  # fmt: skip
        keeper.start()
        return keeper

    def _give_back_unrecorded(self) -> NoReturn:
        """Nobody took the run over, and an ack would lose the message if its twin is gone
        too: the copy goes back to its queue (published again if Celery acked it early)."""
        reason = "its record is gone from the store"
        if self.claim.acks_late:
            raise Reject(reason, requeue=True)
        self._send_back(HandBack(reason))
        raise Dropped("sent back")

    def _send_back(self, exc: HandBack | Deferred) -> None:
        send_back(self.task.app, self._raw_message(), self.facts, self._name(), exc)

    def _give_up(self, reason: str, attempt: int, exceptions: int | None) -> NoReturn:
        """The message will not run: publish the dead letter this run owes, then raise."""
        self.lease = replace(self.lease, attempt=attempt)
        given_up: DeadLettered
        if reason == GiveUpReason.ATTEMPTS_LIMIT.value:
            given_up = AttemptsExhausted(
                f"{self._name()} started {attempt} time(s) without completing "
                f"(attempts={self.limits.attempts}); dead-lettered"
            )
        else:
            given_up = DeadLettered(f"{self._name()} gave up ({reason}); dead-lettered")
        self._dead_letter(reason, given_up, attempt, exceptions)
        raise given_up

    def mark_inbox(self) -> bool:
        if self._inbox_marked:
            return True
        try:
            fence = self.calls(
                lambda: self.store.mark_inbox(self.facts, self.lease.token),
                "inbox mark",
                self.lease.owner,
            )
        except HandBack as exc:
            logger.warning(
                "beetle: %s: cannot note its inbox commit in the store (%s); a crash right "
                "after the commit would dead-letter it rather than run it again to find its row",
                self._name(),
                exc.reason,
            )
            return False
        self._inbox_marked = fence.ok
        return fence.ok

    # -- after -----------------------------------------------------------------------------

    def complete_here(self) -> None:
        """Celery failed a run whose body succeeded on the gate's lease: store the completion
        now, as the main process will not (it sees a failure)."""
        logger.warning(
            "beetle: %s succeeded but Celery failed the run; storing its completion here",
            self._name(),
        )
        self._complete(self.started)

    def _complete(self, started: float, limits_held: bool = False) -> bool:
        if not limits_held:
            time_limits.storing_the_outcome()
        fence = call_until_stored(
            lambda _: self.store.complete(self.facts, self.lease.token),
            f"the completion of {self._name()}",
            max_wait_s=OUTCOME_RETRY_MAX_S,
        )
        if fence.ok:
            self._trace("completed", runtime_ms=round((time.monotonic() - started) * 1000))
            return True
        if fence.record_lost:
            self._record_lost = True
            logger.warning(
                "beetle: completion of %s refused: the store has no record of it (a Redis "
                "failover lost its claim; this run held token %s); nobody took it over",
                self._name(),
                self.lease.token,
            )
            return False
        metrics.lease_lost("pool")
        logger.warning(
            "beetle: late completion of %s refused: its lease ran out and another run took it "
            "over (stored status %s, token %s; this run held token %s)",
            self._name(),
            fence.status.value if fence.status else None,
            fence.token,
            self.lease.token,
        )
        return False

    def _failed(self, exc: Exception) -> BaseException | None:
        """Record the failure; return what to raise instead of ``exc`` (None: ``exc``)."""
        retryable = self.settings.is_retryable(exc)
        time_limits.storing_the_outcome()
        decision = call_until_stored(
            lambda _: self.store.fail(
                self.facts, self.lease.token, self.limits, retryable, self.lease.owner
            ),
            f"the failure of {self._name()}",
            max_wait_s=OUTCOME_RETRY_MAX_S,
        )
        self._trace("failed", exc=f"{type(exc).__name__}: {exc}"[:300])
        if decision.outcome is Failure.NOT_OWNER:
            logger.warning("beetle: failure of %s not recorded: lease taken over", self._name())
            metrics.lease_lost("pool")
            return Ignore()
        if decision.outcome is Failure.GIVE_UP:
            reason = decision.reason.value if decision.reason else "unknown"
            self._dead_letter(reason, exc, decision.attempts, decision.exceptions)
            return None
        try:
            with self.task.app.producer_or_acquire() as producer:
                publish_delayed(
                    producer,
                    self._raw_message(),
                    self.facts.queue,
                    decision.delay_ms,
                    self.facts.scope,
                )
        except Exception as pub_exc:
            # the record says "retry at T"; the copy goes back and the gate defers it to T
            logger.error("beetle: cannot publish the retry of %s (%r)", self._name(), pub_exc)
            return Reject(f"retry not published: {pub_exc!r}", requeue=True)
        self._trace("retried", delay_s=decision.delay_ms / 1000)
        return Retry(exc=exc, when=decision.delay_ms / 1000)

    def _dead_letter(
        self, reason: str, exc: BaseException, attempts: int | None, exceptions: int | None
    ) -> None:
        """Publish the dead letter this run owes, then mark it stored
        (:class:`~.deadletter.OwedDeadLetter`)."""
        owed = OwedDeadLetter(
            self.task.app, self.store, self.facts, self._raw_message(), self.worker, self._name()
        )
        owed.publish(reason, exc, attempts, exceptions)
        self._trace("dead_lettered", reason=reason)
        owed.mark_stored()

    # -- helpers ---------------------------------------------------------------------------

    def _raw_message(self) -> RawMessage:
        return raw_message_from_request(self.request, self.task.name, self.facts.message_id)

    def _name(self) -> str:
        facts = self.facts
        where = facts.queue if facts.scope == facts.queue else f"{facts.queue} in {facts.scope}"
        return f"{self.task.name}[{self.request.id}] ({where}, {facts.message_id})"

    def _trace(self, event: str, **detail: Any) -> None:
        metrics.task_event(event, self.facts.scope, self.task.name, detail)
        if not getattr(self.tracer, "enabled", False):
            return
        self.tracer.emit(
            event,
            self.facts.message_id,
            queue=self.facts.scope,
            task_name=self.task.name,
            task_id=self.request.id,
            broker=self.broker,
            worker=getattr(self.request, "hostname", None),
            attempt=self.lease.attempt or None,
            detail=detail or None,
        )
