"""One run of a BeetleTask body in a pool process: claim, run, then complete or fail.

:class:`Run` is what :meth:`BeetleTask.__call__` hands the body to. It tells Celery what to
do with the delivery through Celery's own control-flow exceptions.

Usually the gate has claimed the message already, in its pipelined batch: a *reservation*
that rides in the delivery's headers (:class:`~celery_beetle.worker.facts.GateClaim`) and counts no
attempt. As the body begins, the pool **starts** it (``start.lua``, one round trip): the
attempt counts and the full lease begins, so ``attempts`` counts bodies that began, and a
delivery that only waited in the pool's queue when its worker died uses none. A reservation
another copy took over meanwhile is not ours: the copy goes back to the gate. A body that
succeeds on the gate's claim costs the pool no other round trip, as the gate stores the
completion before it acks; three rules keep that safe:

- an early ack (``acks_late=False``) comes before the body and proves nothing, so such a run
  stores its completion here;
- a body that runs on the worker's event loop (the solo pool, gevent, eventlet) stores its
  completion here: the loop that would store it runs the next bodies first, and a few long
  ones outlast the lease (the fault explorer's seeds 3022 and 3027: the twin then
  dead-lettered a body that had returned);
- a body that succeeded is completed here after all if Celery then fails the run (a result
  that does not encode, a result backend that raises): the main process would see a
  failure and ack without storing the completion.

Otherwise (no gate claim: a delivery that found a prefork process free, an ETA task, a Redis
Cluster, replicas to wait for, the synchronous gate) the pool claims before the body and
completes after it: two round trips, one of them before the body.

No error of the store's may end with the delivery acked while its outcome is not stored:

- the claim is retried for a few seconds under the same owner (so a claim whose reply was
  lost is recognised as this run's own), then the delivery is handed back
  (:class:`~.errors.HandBack`): the gate requeues it after a backoff, pauses if the store is
  unavailable, and releases the claim by its owner once Redis answers;
- a completion or failure is retried until stored
  (:func:`~celery_beetle.store.health.call_until_stored`);
- a dead letter that cannot be published hands the delivery back; the record keeps it owed,
  so another copy publishes it after the owner's lease.

Where the pool cannot enforce time limits (solo, threads, gevent, eventlet: the body runs in
the worker's main process), a :class:`~celery_beetle.worker.lease.LeaseKeeper` extends the lease
while the body runs, so a slow body is not run again beside itself.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, TypeGuard, TypeVar

from billiard.process import current_process
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import task_failure, task_internal_error, task_postrun

from celery_beetle import metrics
from celery_beetle.settings import BeetleSettings
from celery_beetle.store import RedisStore, wall_clock_ms
from celery_beetle.store.health import call_until_stored, store_unavailable
from celery_beetle.store.outcome import Claim, ClaimDecision, Failure, GiveUpReason
from celery_beetle.store.state import MAX_OWNER_LENGTH, MessageFacts, Status
from celery_beetle.worker import time_limits
from celery_beetle.worker.deadletter import dead_letter_headers, publish_dead_letter
from celery_beetle.worker.errors import AttemptsExhausted, DeadLettered, Deferred, Dropped, HandBack
from celery_beetle.worker.facts import (
    CLAIM_MARK,
    FACTS_HEADER,
    GateClaim,
    facts_from_headers,
    message_facts,
)
from celery_beetle.worker.lease import LeaseKeeper
from celery_beetle.worker.retry_queue import RawMessage, publish_delayed, raw_message_from_request
from kombu_beetle.trace import flush_role, get_tracer

__all__ = [
    "AttemptsExhausted",
    "DeadLettered",
    "HandBack",
    "Run",
    "RunnableTask",
    "is_beetle_task",
    "mark_inbox",
    "process_store",
    "request_facts",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How long a claim is retried (same owner) before the delivery is handed back.
CLAIM_RETRY_S = 3.0


class RunnableTask(Protocol):
    """What the worker needs of a BeetleTask: :class:`~celery_beetle.task.BeetleTask` hands
    itself to :class:`Run`, and the gate step finds such tasks by :func:`is_beetle_task`
    (the task module imports this one, never the other way round)."""

    name: str
    app: Any

    @property
    def beetle_settings(self) -> BeetleSettings: ...

    def apply_beetle_time_limits(self) -> None: ...

    def run(self, *args: Any, **kwargs: Any) -> Any: ...


def is_beetle_task(task: Any) -> TypeGuard[RunnableTask]:
    """Is ``task`` a BeetleTask (an instance of it or of a subclass)? Read from its class,
    so that a property is never run to find out."""
    return callable(getattr(type(task), "apply_beetle_time_limits", None))


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
    now = wall_clock_ms()
    scope = settings.scope_of(queue)
    return message_facts(queue, str(message_id), headers, settings.message_ttl_ms, now, scope)


#: Runs whose body succeeded on the gate's lease, by task id, until Celery reports the run:
#: a failure after the body (see :func:`_completed_after_all`) completes them here. Bounded:
#: a successful run is never looked up again.
_left_to_main: OrderedDict[str, Run] = OrderedDict()
_LEFT_TO_MAIN_MAX = 256


def _leave_to_main(run: Run) -> None:
    _left_to_main[run.request.id] = run
    while len(_left_to_main) > _LEFT_TO_MAIN_MAX:
        _left_to_main.popitem(last=False)


def _completed_after_all(sender: Any = None, task_id: Any = None, **kwargs: Any) -> None:
    """``task_failure`` / ``task_internal_error`` in the pool after a body succeeded."""
    run = _left_to_main.pop(task_id, None) if task_id else None
    if run is not None:
        run.complete_here()


task_failure.connect(_completed_after_all, weak=False)
task_internal_error.connect(_completed_after_all, weak=False)


def _publishes_written(**_: Any) -> None:
    """As a task ends, before its delivery is acked: the ``published`` events of what it
    sent (a chain's next link) are written, so a worker killed after the ack leaves the
    audit the publish of a message that then runs (:func:`kombu_beetle.trace.flush_role`)."""
    flush_role("publisher")


task_postrun.connect(_publishes_written, weak=False)

#: The run whose body is on this thread now (the threads pool runs several at once).
_running = threading.local()


#: task ids whose run on the worker's event loop stored its own completion: the main
#: process's ack must not store (and trace) it a second time (:func:`completed_on_the_loop`)
_completed_on_the_loop: set[str] = set()


def completed_on_the_loop(task_id: str) -> bool:
    """True (once) if the run of ``task_id`` on the event loop stored its completion."""
    try:
        _completed_on_the_loop.remove(task_id)
    except KeyError:
        return False
    return True


def _on_the_event_loop() -> bool:
    """The body runs where the worker's event loop does (solo, gevent, eventlet): the main
    thread of the main process. A threads pool's bodies run beside the loop."""
    return (
        current_process().name == "MainProcess"
        and threading.current_thread() is threading.main_thread()
    )


def mark_inbox(request: Any) -> bool:
    """Tell the store that the body running for ``request`` commits its effects through the
    inbox (:func:`celery_beetle.outbox.inbox.once`), so that a crash right after its commit
    does not use up the message's last attempt: the next run finds the row and returns
    (:data:`~celery_beetle.store.outcome.INBOX_EXTRA_STARTS`). True if stored; a store that does
    not answer within a few seconds costs only that allowance (logged), never the body."""
    run = getattr(_running, "run", None)
    if run is None or run.request.id != getattr(request, "id", None) or not run.token:
        return False
    return run.mark_inbox()


class Run:
    """One run of a BeetleTask body in the pool: claim, run, then complete or fail.

    Control flow goes back to Celery as its own exceptions, which decide the ack:
    ``Ignore`` (ack, no result: a duplicate, an expired message, a lease taken over),
    ``Reject(requeue=True)`` (not now: locked, delayed, Redis down; the gate defers the
    redelivered copy), ``Retry`` (acked, state RETRY, the message is in its delay queue),
    the body's own exception (acked, state FAILURE, the message is dead-lettered).
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
        #: this run's own id in the store: a claim retried under it is recognised as ours
        self.owner = f"{secrets.token_hex(4)}@{self.worker}"[:MAX_OWNER_LENGTH]
        facts_header = getattr(request, FACTS_HEADER, None)
        if not isinstance(facts_header, dict):
            facts_header = {}
        self.broker = facts_header.get("broker")
        #: the gate's claim for this delivery, if it made one
        self.given = GateClaim.from_mark(facts_header.get(CLAIM_MARK))
        #: the gate stores the completion (the body runs on the gate's lease)
        self.main_completes = False
        self.token = 0
        self.lease_deadline_ms = 0
        self.attempt = 0
        self.started = 0.0
        #: when the last call to the store was sent (monotonic): a lease counts from it
        self._sent = time.monotonic()
        self._inbox_marked = False

    def execute(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        _left_to_main.pop(self.request.id, None)
        self._claim_before_the_body()
        self._trace("started")
        self.started = started = time.monotonic()
        keeper = self._keep_lease()
        outer, _running.run = getattr(_running, "run", None), self
        try:
            result = self.task.run(*args, **kwargs)
        except BaseException as exc:
            if keeper is not None:
                keeper.stop()
            self._after_exception(exc, started)
            raise
        finally:
            _running.run = outer
        metrics.task_runtime(self.facts.scope, self.task.name, time.monotonic() - started)
        if keeper is not None:
            keeper.stop()
        if self.main_completes:
            _leave_to_main(self)
        elif not self._complete(started):
            raise Ignore()
        elif self.token and _on_the_event_loop():
            _completed_on_the_loop.add(self.request.id)
        return result

    def _after_exception(self, exc: BaseException, started: float) -> None:
        """Store what the body's exception means; raise a replacement where Celery must see
        another control flow (returns when ``exc`` itself is the right one to raise)."""
        if isinstance(exc, (Retry, Ignore)):
            # the body's own control flow: a Celery retry() is a new message, already sent
            self._complete(started)
            return
        if isinstance(exc, Reject):
            if exc.requeue:
                call_until_stored(lambda _: self.store.release(self.facts, self.token), "a release")
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
            self.store, self.facts, self.token, self.limits.lease_timeout_ms,
            lease_deadline_ms=self.lease_deadline_ms,
        )  # fmt: skip
        keeper.start()
        return keeper

    def _claim_before_the_body(self) -> None:
        """The claim or start, after which the body's time limits count: under prefork from
        the sending of the call that set the lease, never from the moment this process took
        the job (:mod:`~celery_beetle.worker.time_limits`). Without a body, Celery's stand."""
        waiting = time.monotonic()
        time_limits.waiting_on_the_store(waiting)
        counts_from = waiting
        try:
            self._claim()
            if current_process().name == "MainProcess":
                return  # solo, threads, gevent: no time limits, a lease keeper
            counts_from, deadline_ms = time_limits.lease_for_the_body(
                self.store, self.facts, self.token, self.limits, self._sent, self._name()
            )
            self.lease_deadline_ms = deadline_ms or self.lease_deadline_ms
        finally:
            time_limits.limits_count_from(counts_from)

    def _claim(self) -> None:
        given = self.given
        if given is not None:
            self.owner = given.owner
            if given.dead_letter:
                self._give_up(given.dead_letter, given.attempt, given.exceptions)
            self._start(given)
            return
        claim = self._send_claim()
        outcome = claim.outcome
        metrics.pool_claim(outcome.value)
        if outcome is Claim.ACQUIRED:
            if claim.taken_over:
                metrics.lease_taken_over()
            self.token, self.attempt = claim.token, claim.attempt
            self.lease_deadline_ms = claim.lease_deadline_ms
            return
        if outcome is Claim.ALREADY_DONE:
            self._trace("duplicate", status=claim.status.value if claim.status else None)
            raise Dropped("duplicate")
        if outcome is Claim.EXPIRED:
            self._trace("expired")
            raise Dropped("expired")
        if outcome in (Claim.LOCKED, Claim.DELAYED):
            # another worker claimed it since the gate looked: hand the copy back, the gate
            # defers it until that lease ends or the retry is due
            raise Deferred(f"{outcome.value} for {claim.delay_ms} ms")
        # DEAD_LETTER: it will not run; this run publishes its dead letter
        reason = claim.reason or GiveUpReason.ATTEMPTS_LIMIT.value
        self._give_up(reason, claim.attempt, claim.exceptions)

    def _start(self, given: GateClaim) -> None:
        """The body begins on the gate's reservation: one round trip counts the attempt and
        starts the full lease (``start.lua``), so an attempt is a body that began and a
        delivery that only waited in the pool's queue uses none. A reservation another copy
        took over meanwhile (it ran out: this worker's event loop stood still, or Redis was
        away) is not ours: the copy goes back to the gate, which drops it once the message
        is done."""
        fence = self._with_retries(
            lambda: self.store.start(self.facts, given.token, self.limits), "start"
        )
        if fence.ok:
            self.token, self.attempt = given.token, fence.attempt or given.attempt
            self.lease_deadline_ms = fence.lease_deadline_ms
            # the gate stores the completion before its ack; an early ack (acks_late off)
            # proves nothing, so such a run completes here
            self.main_completes = bool(getattr(self.task, "acks_late", True)) and not (
                _on_the_event_loop()
            )
            return
        metrics.pool_claim(Claim.LOCKED.value)
        if fence.status is Status.COMPLETED:
            self._trace("duplicate", status=fence.status.value)
            raise Dropped("duplicate")
        logger.warning(
            "beetle: %s: the gate's reservation was taken over before the body began "
            "(stored status %s); handing the copy back",
            self._name(),
            fence.status.value if fence.status else None,
        )
        raise Deferred("reservation taken over before the body began")

    def _give_up(self, reason: str, attempt: int, exceptions: int | None) -> None:
        """The message will not run: publish the dead letter this run owes, then raise."""
        self.attempt = attempt
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

    def _send_claim(self) -> ClaimDecision:
        """The claim (a start at once: no gate claim), retried under this run's owner."""
        return self._with_retries(
            lambda: self.store.claim(self.facts, self.limits, self.owner), "claim"
        )

    def _with_retries(self, call: Callable[[], _T], what: str) -> _T:
        """``call`` (a claim or a start), retried under this run's owner for
        :meth:`_retry_window` (a retry after a lost reply gets this run's lease back, not a
        second attempt); then the delivery is handed back."""
        deadline = time.monotonic() + self._retry_window()
        wait = 0.1
        while True:
            self._sent = time.monotonic()
            try:
                return call()
            except Exception as exc:
                unavailable = store_unavailable(exc)
                if time.monotonic() + wait > deadline:
                    if unavailable:  # the gate says the outage, once, as it pauses
                        logger.debug(
                            "beetle: cannot %s %s (%r); handing it back", what, self._name(), exc
                        )
                    else:
                        logger.exception(
                            "beetle: the %s of %s failed; handing it back", what, self._name()
                        )
                    raise HandBack(
                        f"{what} not stored: {exc!r}", 2.0, unavailable, self.owner
                    ) from exc
                time.sleep(wait)
                wait = min(wait * 2, 1.0)

    def _retry_window(self) -> float:
        """How long the pool retries the store before handing the delivery back:
        :data:`CLAIM_RETRY_S`, but under prefork at most a tenth of the soft time limit, so a
        pool process is not held waiting for Redis: back in the gate, the delivery waits for
        Redis without a pool slot. (The wait is not taken from the body's time limits, which
        count from the stored start: :mod:`~celery_beetle.worker.time_limits`.)"""
        if current_process().name == "MainProcess":
            return CLAIM_RETRY_S  # solo, threads, gevent: no time limits, a lease keeper
        timelimit = getattr(self.request, "timelimit", None) or (None, None)
        limits = [getattr(self.task, "soft_time_limit", None), timelimit[1]]
        soft = min((float(limit) for limit in limits if limit), default=0.0)
        return min(CLAIM_RETRY_S, soft / 10) if soft else CLAIM_RETRY_S

    def mark_inbox(self) -> bool:
        if self._inbox_marked:
            return True
        try:
            fence = self._with_retries(
                lambda: self.store.mark_inbox(self.facts, self.token), "inbox mark"
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

    def _complete(self, started: float) -> bool:
        fence = call_until_stored(
            lambda _: self.store.complete(self.facts, self.token),
            f"the completion of {self._name()}",
        )
        if fence.ok:
            self._trace("completed", runtime_ms=round((time.monotonic() - started) * 1000))
            return True
        metrics.lease_lost("pool")
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
            lambda _: self.store.fail(self.facts, self.token, self.limits, retryable, self.owner),
            f"the failure of {self._name()}",
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
        """Publish the dead letter this run owes, then mark it stored. If it cannot be
        published the delivery is handed back: the record keeps it owed, and after this
        run's lease on it another copy publishes it."""
        headers = dead_letter_headers(
            reason,
            self.facts.queue,
            exc,
            attempts=attempts,
            exceptions=exceptions,
            worker=self.worker,
            scope=self.facts.scope,
        )
        try:
            with self.task.app.producer_or_acquire() as producer:
                publish_dead_letter(producer, self._raw_message(), self.facts.queue, headers)
        except Exception as pub_exc:
            logger.error(
                "beetle: could not dead-letter %s (%s): %r; handing it back",
                self._name(),
                reason,
                pub_exc,
            )
            raise HandBack(f"dead letter not published: {pub_exc!r}", 5.0) from pub_exc
        self._trace("dead_lettered", reason=reason)
        call_until_stored(
            lambda _: self.store.dead_lettered(self.facts),
            f"that {self._name()} is dead-lettered",
        )

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
            attempt=self.attempt or None,
            detail=detail or None,
        )
