"""The gate: what the worker's main process does with a BeetleTask delivery before the pool.

Every copy of every redundant message reaches the worker; only one may run. The gate looks at
each delivery with at most one Redis call, and either lets it through to Celery's strategy
(and so to the pool), or keeps it from ever taking a pool slot. On Celery's event loop that
call is the **claim** itself, pipelined with the other calls of the loop pass: a delivery
that may run goes to the pool holding a *reservation* (:class:`~.facts.GateClaim`,
:data:`~celery_beetle.store.outcome.RESERVATION_MS`): it keeps other copies away but counts no
attempt, and the gate renews it in its batches while the delivery waits for a pool process.
The pool's start, as the body begins, counts the attempt and starts the full lease, so a
worker killed with deliveries in its pool's queue leaves them to other copies within one
reservation, their attempts unused. When the run succeeded the gate stores the completion
(pipelined again) before it acks (:meth:`DeliveryGate.complete_before_ack`). A redundant
pair then costs three calls (reserve, start, complete), the gate's two sharing round trips
with others. A fresh delivery that finds a prefork process free
(``beetle_claim_in_idle_pool``, :attr:`DeliveryGate.pool_idle`) skips the reservation: it
will not wait, so there is nothing to keep away meanwhile, and the pool claims it as the
body begins and completes it: two calls, and one round trip before the body instead of two.
Where the gate cannot claim (no event loop, a Redis Cluster, replicas to wait for, a task
with an ETA) the call is a read and the pool claims and completes, as
:mod:`celery_beetle.worker.run` describes.

=================  =====================================================================
what it finds      what it does
=================  =====================================================================
nothing, a lease   **run**: hand the delivery to the task's strategy with the gate's lease
that ran out, or   (or, after a read, for the pool to claim). A fresh copy that finds a
a retry now due    pool process free goes on unclaimed, before any call: the pool claims
                   it as the body begins
completed, failed  **duplicate**: ack and drop. A message seen completed (read, or run here:
                   :class:`~celery_beetle.task.BeetleRequest` marks a successful run)
                   is remembered for a minute, so its other copy is dropped without a read
running (a live    **defer**: keep the delivery unacked, raise the prefetch window by one
lease) or delayed  (as Celery does for ETA tasks) and look again on a timer when the lease
(retry later)      ends or the retry is due. The copy is acked only once the message is
                   done, so it survives the death of the broker that holds the other copy
its twin running   **wait**: the other copy went to the pool from *this* worker and has not
here               been acked yet; no Redis call. When that run completes, the waiting copy
                   is dropped at once; after any other ending (retry, failure, a lease
                   taken over) it goes through the gate again. This is what makes a
                   redundant pair cost 3 calls (reserve, start, complete) and no pool slot for the
                   second copy, though both copies arrive almost together
expired            **expired**: ack and drop, without asking Redis
Redis unavailable  **park**: keep the delivery unacked and unprocessed, and stop asking
(unreachable, or   Redis: every later delivery is parked too. Parked deliveries do not
refusing writes)   widen the prefetch window, so the brokers stop sending once it is full,
                   which is how the worker "stops taking messages". A probe (a write) runs
                   on a timer; when Redis takes it, every parked delivery goes through the
                   gate again
bad input          **dead-letter** (no ``message_id``, a body that does not decode, a
                   header no publisher of this project writes): publish it to
                   ``<queue>.dead`` with the reason, then ack; once per message
an error nobody    **hand back**: log it in full, and requeue the delivery after a backoff
foresaw            (0.5 s, doubling to 30 s per message). Never an ack
=================  =====================================================================

A message leaves its queue only once its outcome or its dead letter is stored: a dead letter
that cannot be published, a pool run that could not claim (the pool's
:class:`~celery_beetle.worker.errors.HandBack`) and an unknown task within its grace period (a
rolling deploy: see :meth:`DeliveryGate.unknown_task`) are all handed back, never acked.

Deferred copies are bounded (``max_deferred`` copies, ``max_deferred_bytes`` of bodies): past
either bound a deferred copy no longer widens the prefetch window, so the brokers stop
sending this worker new messages until deferred copies resolve.

On Celery's event loop the call does not block the worker: the calls of one loop pass go to
Redis as one batch and each delivery goes on from its reply (:mod:`~.gate_reads`);
a copy whose twin is being claimed waits for that claim. Without a loop, or with a Redis
Cluster, the gate reads synchronously through the store.

Nothing here imports Celery: the consumer bootstep (:mod:`celery_beetle.worker.bootstep`) gives the
gate a timer, the prefetch QoS, a dead-letter publisher and the task strategy to start; unit
tests give it fakes and a :class:`~celery_beetle.store.fake.FakeStore`.

The gate writes its findings for the pool into the delivery's headers (see
:mod:`celery_beetle.worker.facts`), so the claim in the pool uses the same queue, scope,
``message_id`` and expiry as the gate did.

A delivery's identity is ``(scope, message_id)``: the scope of the queue it came from
(``scopes``, from ``beetle_dedup_scopes``; the queue's own name by default). Copies that share
it are one message wherever they came from, so a copy in an old and one in a new queue of a
migration wait for each other as the two copies of one queue do, and run once. Trace events
name the scope in their ``queue`` field, as the audit's identity is the same pair.

The gate is one object, :class:`DeliveryGate`, written in five modules so that each reads
on its own:

===================  ==================================================================
this module          what the gate finds and decides for a delivery, and running it
:mod:`.held`         what it holds, and what it does with a copy it does not run now:
                     drop, defer, hold a twin, hand back
:mod:`.gate_claims`  the claims it makes: reservations renewed until the body begins,
                     completions stored before the ack
:mod:`.outage`       Redis unavailable: park, probe, release, resume
:mod:`.bad_input`    bad input and unknown tasks
===================  ==================================================================
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_beetle.store import Store, wall_clock_ms
from celery_beetle.store.health import store_unavailable
from celery_beetle.store.outcome import (
    RESERVATION_MS,
    Claim,
    ClaimDecision,
    GateDecision,
    Limits,
    decide_gate,
)
from celery_beetle.store.outcome import Gate as Verdict
from celery_beetle.store.state import MAX_OWNER_LENGTH, MessageFacts, Status
from celery_beetle.worker.bad_input import BadInput, BadInputHandling, DeadLetter
from celery_beetle.worker.facts import (
    CLAIM_MARK,
    COMPLETED_MARK,
    FACTS_HEADER,
    GateClaim,
    InvalidHeader,
    facts_header,
    message_facts,
)
from celery_beetle.worker.gate_claims import ClaimKeeping
from celery_beetle.worker.handback import HandBacks, requeue
from celery_beetle.worker.held import HELD_MARK, CompletedMemory, Delivery, Holding, QoSLike, Twin
from celery_beetle.worker.outage import StoreOutage
from kombu_beetle.scopes import scope_of
from kombu_beetle.trace import NullTracer

__all__ = ["BadInput", "DeadLetter", "DeliveryGate"]

logger = logging.getLogger(__name__)


class _RunEnding:
    """``done`` of a delivery the gate started (:meth:`DeliveryGate.handle`): called once its
    ack or reject happens, or with the pool's hand-back mark. An object, not a closure that
    names itself: such a closure is a reference cycle, and every delivery it holds (its
    message, its Celery request) would wait for the cyclic garbage collector, whose full
    collections then pause the worker's main process for tens of milliseconds."""

    __slots__ = ("delivery", "finished", "gate")

    def __init__(self, gate: DeliveryGate, delivery: Delivery) -> None:
        self.gate = gate
        self.delivery = delivery
        self.finished = False

    def __call__(
        self, mark: dict[str, Any] | None = None, reject: Callable[[], Any] | None = None
    ) -> None:
        if self.finished:
            return
        d, gate = self.delivery, self.gate
        if mark is not None and reject is not None:
            gate._pool_handed_back(d, mark, reject, self)
            return
        self.finished = True
        gate._unreserve(d.key, d.generation)
        facts = (d.message.headers or {}).get(FACTS_HEADER)
        completed = isinstance(facts, dict) and bool(facts.get(COMPLETED_MARK))
        gate._finished(d.key, d.generation, completed)


@dataclass
class DeliveryGate(Holding, ClaimKeeping, StoreOutage, BadInputHandling):
    """The main-process gate. One per worker consumer; everything runs on its event loop.

    - ``store``: the dedup store (one ``gate()`` read per look).
    - ``call_later(seconds, fn)``: a timer on the event loop (0 = soon).
    - ``qos()``: the consumer's prefetch QoS now (it changes when the consumer restarts).
    - ``dead_letter(message, queue, reason, detail)``: publish a bad delivery to its
      dead-letter queue once per message (see :data:`DeadLetter`); the gate acks it after.
    - ``queue_of(message)``: the queue a delivery was consumed from.
    - ``probe()``: True once Redis answers again (used while paused, and once at start).
    - ``scopes``: ``{queue: dedup scope}``; a queue it does not name is its own scope.
    """

    store: Store
    call_later: Callable[[float, Callable[[], None]], Any]
    qos: Callable[[], QoSLike | None]
    dead_letter: DeadLetter
    queue_of: Callable[[Any], str]
    probe: Callable[[], bool]
    tracer: Any = field(default_factory=NullTracer)
    scopes: Mapping[str, str] = field(default_factory=dict)
    message_ttl_ms: int = 86_400_000
    clock: Callable[[], int] = wall_clock_ms
    #: a copy deferred under a running lease is looked at again after this, then doubling
    #: (each look is one pipelined claim)
    recheck_min_s: float = 0.05
    #: a deferred copy is looked at again at least this often, even under a long lease
    recheck_max_s: float = 30.0
    probe_interval_s: float = 1.0
    store_name: str = "redis"  # the store as the logs name it (its URL, password masked)
    #: how many runs that completed here, and for how long, the gate remembers
    completed_memory_size: int = 10_000
    completed_memory_ms: int = 60_000
    worker: str | None = None
    stats: Counter[str] = field(default_factory=Counter)
    #: the gate's claims by outcome, and the seconds Redis was unavailable (for the metrics)
    claims: Counter[Claim] = field(default_factory=Counter)
    unavailable_s: float = 0.0
    paused: bool = False
    #: pipelined reads on the event loop (:mod:`celery_beetle.worker.gate_reads`); None: read
    #: synchronously through ``store.gate``
    reads: Any = None
    #: past either bound, a deferred copy no longer widens the prefetch window
    max_deferred: int = 1_000
    max_deferred_bytes: int = 64 * 1024 * 1024
    #: an unknown task is handed back for this long after a worker first saw it
    unknown_task_grace_ms: int = 600_000
    #: hand-backs wait 0.5 s, doubling per message up to this
    handback_max_s: float = 30.0
    #: ``claims_for(message, task_name)``: the limits to claim a delivery with in the gate's
    #: batch (pipelined calls only), or None to read and leave the claim to the pool
    claims_for: Callable[[Any, str], Limits | None] = field(default=lambda message, name: None)
    #: a completion that could not be stored is tried again after this, doubling to 5 s
    completion_retry_s: float = 0.1
    #: ``handing_back(message)``: True while its queue is handed back to its brokers (a
    #: queue migration: :mod:`celery_beetle.ops.handback_control`); requeued, not examined
    handing_back: Callable[[Any], bool] = field(default=lambda message: False)
    #: ``pool_idle()``: True while a pool process is free for one more run. A fresh delivery
    #: (not redelivered) then goes to the pool at once and the pool claims it as the body
    #: begins (one round trip), instead of the gate's claim and then the pool's start (two
    #: round trips in a row, before the body). With the pool busy, the gate claims as before,
    #: so a delivery that waits for a process holds a reservation
    pool_idle: Callable[[], bool] = field(default=lambda: False)

    def __post_init__(self) -> None:
        self.generation = 0
        self._in_flight: set[tuple[str, str]] = set()
        self._waiting: dict[tuple[str, str], list[Delivery | Twin]] = {}
        self._parked: list[Delivery] = []
        self._completed = CompletedMemory(
            self.clock, self.completed_memory_size, self.completed_memory_ms
        )
        self.handbacks = HandBacks(self.call_later, self.handback_max_s, self.completed_memory_size)
        #: claims the pool could not confirm: released by their owner once Redis answers
        self._to_release: list[tuple[MessageFacts, str]] = []
        self.deferred = 0
        self.deferred_bytes = 0
        self._claims = 0
        self.paused_at = 0.0
        self._counted_at_pause: dict[str, int] = {}
        self._owner_base = f"{secrets.token_hex(3)}@{self.worker or socket.gethostname()}"
        #: acks of completions stored in this batch, made once their events are written
        self._acks_after_trace: list[Callable[[], None]] = []
        #: reservations renewed until their run ends: identity -> (facts, token, ms)
        self._reserved: dict[tuple[str, str], tuple[MessageFacts, int, int]] = {}
        self._owed: dict[int, Any] = {}  # completions not stored yet (ClaimKeeping)
        self._renewing = False
        self._trace_before_ack = self.reads is not None and getattr(self.tracer, "enabled", False)
        if self.reads is not None and self._trace_before_ack:
            self.reads.after_batch = self.after_batch

    # -- entry point -----------------------------------------------------------------------

    def handle(self, message: Any, task_name: str, start: Callable[..., None]) -> str:
        """Gate one delivery. ``start(done)`` hands it to Celery and never raises;
        ``done()`` must be called when its ack or reject happens (``done(mark, reject)``
        when the pool handed it back: see :meth:`_pool_handed_back`). Returns what was
        done, for tests and logs. Nothing raises out of here: an error nobody foresaw
        hands the delivery back."""
        if not (getattr(message, "delivery_info", None) or {}).get(HELD_MARK):
            self.stats["delivered"] += 1  # a held twin sent on was counted as it arrived
        try:
            return self._handle(message, task_name, start)
        except Exception:
            logger.exception("beetle: the gate failed on a %s delivery; handing it back", task_name)
            self.stats["errors"] += 1
            return self._hand_back(message, None)

    def _handle(self, message: Any, task_name: str, start: Callable[..., None]) -> str:
        queue = self.queue_of(message)
        properties = message.properties or {}
        headers = message.headers if message.headers is not None else {}
        message_id = properties.get("message_id")
        scope = scope_of(self.scopes, queue)
        info = message.delivery_info if message.delivery_info is not None else {}
        held = info.pop(HELD_MARK, False)
        if not held:  # a held twin sent on was traced as it arrived
            self._trace("delivered", str(message_id or "")[:200], scope, task_name, message)
        if not message_id:
            return self._bad_input(message, queue, task_name, BadInput.NO_MESSAGE_ID.value, "")
        try:
            facts = message_facts(
                queue, message_id, headers, self.message_ttl_ms, self.clock(), scope
            )
        except InvalidHeader as exc:
            return self._bad_input(
                message, queue, task_name, BadInput.INVALID_HEADER.value, str(exc)
            )
        try:
            message.payload  # noqa: B018 (decodes once; Celery reuses the cached result)
        except Exception as exc:
            return self._bad_input(message, queue, task_name, BadInput.UNDECODABLE.value, repr(exc))
        headers[FACTS_HEADER] = facts_header(facts)
        body = getattr(message, "body", b"")
        size = len(body) if isinstance(body, (bytes, str)) else 0
        delivery = Delivery(message, task_name, facts, start, self.generation, size=size)
        if facts.expires_at_ms <= self.clock():
            return self._drop(delivery, "expired")
        return self._examine(delivery, fresh=not (held or info.get("redelivered")))

    def reset(self) -> None:
        """Forget every held delivery: the consumer's connection is going away, so they
        cannot be acked any more and their brokers will deliver them again."""
        self.generation += 1
        if self.reads is not None:
            self.reads.close()  # the consumer's restart also empties the event loop
        self._in_flight.clear()
        self._waiting.clear()
        self._parked.clear()
        self._reserved.clear()
        self.deferred = self.deferred_bytes = 0

    @property
    def held(self) -> int:
        """Deliveries waiting for a twin or parked (deferred ones sit on timers)."""
        return sum(len(w) for w in self._waiting.values()) + len(self._parked)

    # -- the decision ------------------------------------------------------------------------

    def _examine(self, d: Delivery, fresh: bool = False) -> str:
        if self.handing_back(d.message):
            self.stats["given_back"] += 1
            requeue(d.message)
            return "given_back"
        if self.paused:
            self._parked.append(d)
            self.stats["parked"] += 1
            return "parked"
        if d.key in self._in_flight:
            self._waiting.setdefault(d.key, []).append(d)
            self.stats["waiting"] += 1
            return "waiting"
        if d.key in self._completed:
            self.stats["known_completed"] += 1
            return self._drop(d, "duplicate", status=Status.COMPLETED)
        if self.reads is not None:
            if fresh and self._to_idle_pool(d):
                return self._run(d)
            return self._read(d)
        try:
            decision = self.store.gate(d.facts)
        except Exception as exc:
            return self._trouble(d, exc)
        return self._decide(d, decision)

    def _to_idle_pool(self, d: Delivery) -> bool:
        """Whether ``d`` goes to the pool unclaimed, for the pool's claim (:attr:`pool_idle`):
        a first delivery of a task the gate would claim, with a pool process free for it. A
        redelivered copy, or one looked at again, is likelier a duplicate: the gate asks
        Redis first, so that it takes no pool slot."""
        if not self.pool_idle() or self.claims_for(d.message, d.task_name) is None:
            return False
        self.stats["to_idle_pool"] += 1
        return True

    def _trouble(self, d: Delivery, exc: BaseException) -> str:
        """Reading ``d``'s record failed: park it and pause if the store is unavailable;
        otherwise (a bug, a record nobody can read) hand it back, logged in full."""
        if store_unavailable(exc):
            self._pause(exc)
            self._parked.append(d)
            self.stats["parked"] += 1
            return "parked"
        logger.error(
            "beetle: cannot gate %s (%s, %s); handing it back",
            d.task_name,
            d.facts.scope,
            d.facts.message_id[:100],
            exc_info=exc,
        )
        self.stats["errors"] += 1
        return self._hand_back(d.message, d.key)

    def _read(self, d: Delivery) -> str:
        """Ask Redis without waiting (:mod:`celery_beetle.worker.gate_reads`); the delivery goes on
        from the reply. Meanwhile its twin waits for this call instead of making its own.

        Where the gate may claim (:attr:`claims_for`), the call is the claim itself: a
        delivery that may run goes to the pool holding its lease, and the pool makes no
        round trip of its own. Otherwise it is a read, and the pool claims."""
        now = self.clock()
        if d.facts.expires_at_ms <= now:
            return self._decide(d, decide_gate(None, d.facts, now))
        limits = self.claims_for(d.message, d.task_name)
        owner = self._next_owner() if limits is not None else ""
        reserve_ms = min(RESERVATION_MS, limits.lease_timeout_ms) if limits is not None else 0
        key = d.key
        self._in_flight.add(key)

        def answered(answer: Any, exc: BaseException | None) -> None:
            if d.generation != self.generation:
                # the consumer restarted: this delivery cannot be acked; a claim made for it
                # (or maybe made: no reply) is released, so its redelivery need not wait
                if owner and (exc is not None or answer.outcome is Claim.ACQUIRED):
                    self._release_later(d.facts, owner)
                return
            self._in_flight.discard(key)
            waiters = self._waiting.pop(key, [])
            if exc is not None:
                self._trouble(d, exc)
                for waiter in waiters:
                    if isinstance(waiter, Twin):
                        self._deliver_on(waiter)
                    else:
                        self._trouble(waiter, exc)
                if owner:  # the claim may have been applied without its reply arriving
                    self._release_later(d.facts, owner)
                return
            try:
                if owner:
                    self._claimed(d, answer, owner, reserve_ms)
                else:
                    self._decide(d, decide_gate(answer, d.facts, self.clock()))
            except Exception as error:
                self._trouble(d, error)
            if not waiters:
                return
            if key in self._in_flight:  # it went to the pool: they wait for its run
                self._waiting.setdefault(key, []).extend(waiters)
            else:  # dropped or deferred: each looks again (a completion is remembered)
                self._wake(waiters)

        assert self.reads is not None
        if limits is not None:
            self.reads.claim(d.facts, limits, owner, answered, reserve_ms=reserve_ms)
        else:
            self.reads.read(d.facts, answered)
        return "reading"

    def _claimed(
        self, d: Delivery, claim: ClaimDecision, owner: str, reserve_ms: int = RESERVATION_MS
    ) -> str:
        """Go on from the gate's claim as the pool would have (:class:`~.run.Run`). An
        acquired claim is a reservation: renewed here until the run ends, and turned into
        the run's lease by the pool's start as the body begins."""
        outcome = claim.outcome
        self.claims[outcome] += 1
        if outcome is Claim.ACQUIRED:
            if claim.taken_over:
                self.stats["taken_over"] += 1
            given = GateClaim(owner, claim.token, claim.attempt, claim.lease_deadline_ms)
            self._reserve(d.key, d.facts, claim.token, reserve_ms)
            return self._run(d, given)
        if outcome is Claim.DEAD_LETTER:  # the pool publishes it, as for its own claim
            reason = claim.reason or "attempts_limit"
            given = GateClaim(
                owner, attempt=claim.attempt, dead_letter=reason, exceptions=claim.exceptions
            )
            return self._run(d, given)
        if outcome is Claim.ALREADY_DONE:
            return self._decide(d, GateDecision(Verdict.DROP_DUPLICATE, status=claim.status))
        if outcome is Claim.EXPIRED:
            return self._drop(d, "expired")
        running = outcome is Claim.LOCKED
        return self._defer(d, claim.delay_ms, running=running)

    def _next_owner(self) -> str:
        """A claim's owner: unique per claim (the counter comes first, as the store keeps
        at most :data:`~celery_beetle.store.state.MAX_OWNER_LENGTH` characters)."""
        self._claims += 1
        return f"{self._claims:x}.{self._owner_base}"[:MAX_OWNER_LENGTH]

    def _decide(self, d: Delivery, decision: GateDecision) -> str:
        if decision.outcome is Verdict.RUN:
            return self._run(d)
        if decision.outcome is Verdict.DROP_DUPLICATE:
            if decision.status is Status.COMPLETED:
                self._completed.remember(d.key)  # its twin, if it comes here, costs no read
            return self._drop(d, "duplicate", status=decision.status)
        if decision.outcome is Verdict.DROP_EXPIRED:
            return self._drop(d, "expired")
        return self._defer(d, decision.delay_ms, running=decision.status is Status.RUNNING)

    def _run(self, d: Delivery, claim: GateClaim | None = None) -> str:
        key = d.key
        self._in_flight.add(key)
        self.stats["run"] += 1
        if claim is not None:
            header = (d.message.headers or {}).get(FACTS_HEADER)
            if isinstance(header, dict):
                header[CLAIM_MARK] = claim.mark()
        d.start(_RunEnding(self, d))
        return "run"

    def _pool_handed_back(
        self,
        d: Delivery,
        mark: dict[str, Any],
        reject: Callable[[], Any],
        done: Callable[[], None],
    ) -> None:
        """The pool could not take ``d`` (:class:`~celery_beetle.worker.run.HandBack`): requeue it
        after a backoff instead of at once. If the store was unavailable, pause, and release
        the claim the pool sent without an answer once Redis answers again."""
        if mark.get("store"):
            self._pause(RuntimeError(str(mark.get("reason") or "the pool's claim failed")))
        owner = mark.get("owner")
        if owner:
            self._to_release.append((d.facts, str(owner)))
            if not self.paused:  # else the probe releases it before the gate resumes
                self._release_unconfirmed_claims()
        delay = max(float(mark.get("delay_s") or 0), self.handbacks.delay_for(d.key, d.message))
        self.stats["handed_back"] += 1

        def requeue() -> None:
            try:
                reject()
            finally:
                done()

        self.call_later(delay, requeue)

    def _finished(self, key: tuple[str, str], generation: int, completed: bool) -> None:
        if generation != self.generation:
            return
        self._in_flight.discard(key)
        if completed:
            self._completed.remember(key)
        waiters = self._waiting.pop(key, None)
        if not waiters:
            return
        if completed:  # duplicates for sure: ack them now, no timer, no read
            for d in waiters:
                self.stats["known_completed"] += 1
                if isinstance(d, Twin):
                    self._drop_twin(d)
                else:
                    self._drop(d, "duplicate", status=Status.COMPLETED)
            return
        self.call_later(0, lambda: self._wake(waiters))

    def _wake(self, waiters: list[Delivery | Twin]) -> None:
        for d in waiters:
            if isinstance(d, Twin):
                self._deliver_on(d)
            elif d.generation == self.generation:
                self._examine(d)

    def _trace_run(
        self,
        event: str,
        facts: MessageFacts,
        message: Any,
        attempt: int,
        detail: dict[str, Any] | None,
        pid: int | None = None,
    ) -> None:
        if not getattr(self.tracer, "enabled", False):
            return
        info = message.delivery_info or {}
        self.tracer.emit(
            event,
            facts.message_id,
            queue=facts.scope,
            task_name=(message.headers or {}).get("task"),
            task_id=(message.headers or {}).get("id"),
            broker=info.get("beetle_broker"),
            worker=self.worker,
            pid=pid,
            attempt=attempt or None,
            detail=detail,
        )

    def _trace(
        self,
        event: str,
        message_id: str,
        queue: str,
        task_name: str,
        message: Any,
        detail: dict[str, Any] | None = None,
    ) -> None:
        if not getattr(self.tracer, "enabled", False):
            return
        info = message.delivery_info or {}
        if event == "delivered":
            detail = {"redelivered": bool(info.get("redelivered"))}
        self.tracer.emit(
            event,
            message_id,
            queue=queue,
            task_name=task_name,
            task_id=(message.headers or {}).get("id"),
            broker=info.get("beetle_broker"),
            worker=self.worker,
            detail=detail,
        )
