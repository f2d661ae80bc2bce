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
with others. Where the gate cannot claim (no event loop, a Redis Cluster, replicas to wait
for, a task with an ETA) the call is a read and the pool claims and completes, as
:mod:`celery_beetle.worker.run` describes.

=================  =====================================================================
what it finds      what it does
=================  =====================================================================
nothing, a lease   **run**: hand the delivery to the task's strategy with the gate's lease
that ran out, or   (or, after a read, for the pool to claim)
a retry now due
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
:class:`~celery_beetle.worker.run.HandBack`) and an unknown task within its grace period (a rolling
deploy: see :meth:`DeliveryGate.unknown_task`) are all handed back, never acked.

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
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery_beetle import metrics
from celery_beetle.store import Store, wall_clock_ms
from celery_beetle.store.health import store_unavailable
from celery_beetle.store.outcome import (
    RESERVATION_MS,
    Claim,
    ClaimDecision,
    FenceDecision,
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
    PID_MARK,
    RUNTIME_MARK,
    GateClaim,
    InvalidHeader,
    facts_from_headers,
    facts_header,
    message_facts,
)
from celery_beetle.worker.handback import HandBacks, ack, channel_open, requeue
from kombu_beetle.brokers import incarnation_of, settle_raw
from kombu_beetle.scopes import scope_of
from kombu_beetle.trace import NullTracer

__all__ = ["BadInput", "DeadLetter", "DeliveryGate"]

logger = logging.getLogger(__name__)


class QoSLike(Protocol):
    def increment_eventually(self, n: int = 1) -> int: ...

    def decrement_eventually(self, n: int = 1) -> int: ...


@dataclass(eq=False)
class Delivery:
    """One delivery held by the gate, and how to start it when its turn comes."""

    message: Any
    task_name: str
    facts: MessageFacts
    start: Callable[[Callable[[], None]], None]
    generation: int
    qos: QoSLike | None = None  # the QoS whose window it widened while deferred
    rechecks: int = 0
    size: int = 0  # body bytes, counted against max_deferred_bytes while deferred

    @property
    def key(self) -> tuple[str, str]:
        return self.facts.identity


#: in a held twin's ``delivery_info`` (kombu's Message shares the dict): traced already
HELD_MARK = "beetle_held"


@dataclass(eq=False)
class Twin:
    """A copy held before kombu made a Message of it (:meth:`DeliveryGate.hold_twin`): a
    copy with its identity is running in this worker. When that run completes the twin is
    acked as a duplicate; after any other ending it is delivered on, through Celery and the
    gate, as any copy. A twin is its own message view (the trace and hand-back helpers read
    ``headers``, ``delivery_info`` and ``channel`` and call ``ack`` and ``reject``)."""

    raw: Any
    task_name: str
    key: tuple[str, str]
    deliver: Callable[[Any], Any]
    generation: int
    incarnation: int = 0  # of its broker channel as it arrived (kombu_beetle.brokers)
    settled: bool = False

    @property
    def message(self) -> Twin:
        return self

    @property
    def stale(self) -> bool:
        """Its channel was closed and reopened since it arrived: the broker gave it back."""
        return incarnation_of(self.raw) != self.incarnation

    @property
    def headers(self) -> dict[str, Any]:
        return self.raw.properties.get("application_headers") or {}

    @property
    def properties(self) -> dict[str, Any]:
        return self.raw.properties

    @property
    def delivery_info(self) -> dict[str, Any]:
        return self.raw.delivery_info

    @property
    def channel(self) -> Any:
        return self.raw.channel

    def ack(self) -> None:
        if not self.settled:
            self.settled = True
            settle_raw(self.raw, self.incarnation)

    def reject(self, requeue: bool = True) -> None:
        if not self.settled:
            self.settled = True
            settle_raw(self.raw, self.incarnation, requeue=requeue)


@dataclass
class DeliveryGate(BadInputHandling):
    """The main-process gate. One per worker consumer; everything runs on its event loop.

    - ``store``: the dedup store (one ``gate()`` read per look).
    - ``call_later(seconds, fn)``: a timer on the event loop (0 = soon).
    - ``qos()``: the consumer's prefetch QoS now (it changes when the consumer restarts).
    - ``dead_letter(message, queue, reason, detail)``: publish a bad delivery to its
      dead-letter queue once per message (see :data:`DeadLetter`); the gate acks it after.
    - ``queue_of(message)``: the queue a delivery was consumed from.
    - ``probe()``: True once Redis answers again (used while paused).
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

    def __post_init__(self) -> None:
        self.generation = 0
        self._in_flight: set[tuple[str, str]] = set()
        self._waiting: dict[tuple[str, str], list[Delivery | Twin]] = {}
        self._parked: list[Delivery] = []
        self._completed: OrderedDict[tuple[str, str], int] = OrderedDict()
        self.handbacks = HandBacks(self.call_later, self.handback_max_s, self.completed_memory_size)
        #: claims the pool could not confirm: released by their owner once Redis answers
        self._to_release: list[tuple[MessageFacts, str]] = []
        self.deferred = 0
        self.deferred_bytes = 0
        self._claims = 0
        self.paused_at = 0.0
        self._owner_base = f"{secrets.token_hex(3)}@{self.worker or socket.gethostname()}"
        #: acks of completions stored in this batch, made once their events are written
        self._acks_after_trace: list[Callable[[], None]] = []
        #: reservations of deliveries handed to the pool, renewed until their run ends:
        #: identity -> (facts, token, reservation ms)
        self._reserved: dict[tuple[str, str], tuple[MessageFacts, int, int]] = {}
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
        if not info.pop(HELD_MARK, False):  # a held twin sent on was traced as it arrived
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
        return self._examine(delivery)

    def hold_twin(self, raw: Any, task_name: str, deliver: Callable[[Any], Any]) -> bool:
        """The transport's delivery filter (:data:`kombu_beetle.channel_host.DeliveryFilter`)
        for a gated task's raw delivery: True when the gate took it as a :class:`Twin`,
        because a copy with its identity is in flight here (it waits for that run) or
        completed here a moment ago (it is acked now). Either way it costs no Redis call,
        no kombu Message and no Celery strategy call: the second copy of a redundant pair
        should cost far less than the first. Anything else (no ``message_id``, Redis
        unavailable, a queue being handed back) is left to :meth:`handle`."""
        if self.paused:
            return False
        message_id = raw.properties.get("message_id")
        if not isinstance(message_id, str) or not message_id:
            return False
        key = (scope_of(self.scopes, self.queue_of(raw)), message_id)
        in_flight = key in self._in_flight
        if not in_flight and not self._completed_here(key):
            return False
        twin = Twin(raw, task_name, key, deliver, self.generation, incarnation_of(raw))
        if self.handing_back(twin):
            return False
        self.stats["delivered"] += 1
        self.stats["twins_held"] += 1
        self._trace("delivered", message_id, key[0], task_name, twin)
        raw.delivery_info[HELD_MARK] = True
        if in_flight:
            self.stats["waiting"] += 1
            self._waiting.setdefault(key, []).append(twin)
        else:
            self.stats["known_completed"] += 1
            self._drop_twin(twin)
        return True

    def _drop_twin(self, twin: Twin) -> None:
        """Ack a twin as a duplicate of a message that completed here."""
        self.stats["duplicate"] += 1
        detail = {"status": Status.COMPLETED.value}
        self._trace("duplicate", twin.key[1], twin.key[0], twin.task_name, twin, detail)
        if self._acking_after_trace():
            self._acks_after_trace.append(lambda: ack(twin))
        else:
            ack(twin)

    def _deliver_on(self, twin: Twin) -> None:
        """Send a held twin on through Celery and the gate, soon (not from inside the
        caller's batch of Redis replies), unless its consumer restarted meanwhile."""

        def deliver() -> None:
            if twin.generation != self.generation or twin.stale or twin.settled:
                return  # its connection or channel is gone: its broker delivers it again
            try:
                twin.deliver(twin.raw)
            except Exception:  # unacked: its broker delivers it again with the channel
                logger.exception("beetle: cannot deliver a held copy of %s on", twin.key[1][:100])

        self.call_later(0, deliver)

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

    def _examine(self, d: Delivery) -> str:
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
        if self._completed_here(d.key):
            self.stats["known_completed"] += 1
            return self._drop(d, "duplicate", status=Status.COMPLETED)
        if self.reads is not None:
            return self._read(d)
        try:
            decision = self.store.gate(d.facts)
        except Exception as exc:
            return self._trouble(d, exc)
        return self._decide(d, decision)

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
        at most :data:`~.state.MAX_OWNER_LENGTH` characters)."""
        self._claims += 1
        return f"{self._claims:x}.{self._owner_base}"[:MAX_OWNER_LENGTH]

    def _decide(self, d: Delivery, decision: GateDecision) -> str:
        if decision.outcome is Verdict.RUN:
            return self._run(d)
        if decision.outcome is Verdict.DROP_DUPLICATE:
            if decision.status is Status.COMPLETED:
                self._remember_completed(d.key)  # its twin, if it comes here, costs no read
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
        finished = False

        def done(
            mark: dict[str, Any] | None = None, reject: Callable[[], Any] | None = None
        ) -> None:
            nonlocal finished
            if finished:
                return
            if mark is not None and reject is not None:
                self._pool_handed_back(d, mark, reject, done)
                return
            finished = True
            self._unreserve(key, d.generation)
            facts = (d.message.headers or {}).get(FACTS_HEADER)
            completed = isinstance(facts, dict) and bool(facts.get(COMPLETED_MARK))
            self._finished(key, d.generation, completed)

        d.start(done)
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
            self._remember_completed(key)
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

    # -- reservations ----------------------------------------------------------------------

    def _reserve(self, key: tuple[str, str], facts: MessageFacts, token: int, ms: int) -> None:
        """Keep the reservation of a delivery handed to the pool alive while it waits for a
        pool process: a worker killed meanwhile leaves it to another copy within one
        reservation (seconds), not a lease; a body never starts on it (the pool's start
        gives the full lease). Renewals ride in the batches, every third of a reservation."""
        if ms <= 0 or self.reads is None:
            return
        self._reserved[key] = (facts, token, ms)
        if not self._renewing:
            self._renewing = True
            self.call_later(ms / 3000, self._renew_reservations)

    def _unreserve(self, key: tuple[str, str], generation: int) -> None:
        if generation == self.generation:
            self._reserved.pop(key, None)

    def _renew_reservations(self) -> None:
        self._renewing = False
        if not self._reserved or self.reads is None:
            return
        if not self.paused:  # while Redis is away the reservations may run out: the pool's
            # start then finds out, and hands its delivery back if another copy took it
            for key, (facts, token, ms) in list(self._reserved.items()):
                self.reads.renew(facts, token, ms, self._renewed(key, token))
        self._renewing = True
        shortest = min(ms for _, _, ms in self._reserved.values())
        self.call_later(shortest / 3000, self._renew_reservations)

    def _renewed(
        self, key: tuple[str, str], token: int
    ) -> Callable[[FenceDecision | None, BaseException | None], None]:
        def answered(fence: FenceDecision | None, exc: BaseException | None) -> None:
            if exc is not None:
                logger.debug("beetle: cannot renew a reservation (%r); trying again", exc)
                return
            held = self._reserved.get(key)
            if fence is None or held is None or held[1] != token:
                return
            if not fence.ok:  # another copy holds it now: the pool's start will see that
                del self._reserved[key]
            elif fence.lease_deadline_ms > self.clock() + held[2] + 1000:
                del self._reserved[key]  # its body began: the run's lease stands

        return answered

    # -- completions stored before the ack ----------------------------------------------------

    def complete_before_ack(self, message: Any, ack: Callable[[], None]) -> bool:
        """If the gate claimed ``message`` and its run succeeded, store the completion in
        the next batch and ``ack()`` only once it is stored (retried until it is); True if
        so. False: nothing to store here (the pool stored the outcome), ack now."""
        header = (message.headers or {}).get(FACTS_HEADER)
        if not isinstance(header, dict) or not header.get(COMPLETED_MARK):
            return False
        claim = GateClaim.from_mark(header.get(CLAIM_MARK))
        facts = facts_from_headers(header)
        if claim is None or not claim.token or facts is None or self.reads is None:
            return False
        self._complete(message, header, facts, claim, ack, self.completion_retry_s)
        return True

    def _complete(
        self,
        message: Any,
        header: dict[str, Any],
        facts: MessageFacts,
        claim: GateClaim,
        ack: Callable[[], None],
        retry_s: float,
    ) -> None:
        def answered(fence: FenceDecision | None, exc: BaseException | None) -> None:
            if exc is not None or fence is None:
                # never ack what is not stored: again after a while, whatever the error
                unavailable = exc is not None and store_unavailable(exc)
                if unavailable:
                    self._pause(exc)  # type: ignore[arg-type]
                log = logger.warning if unavailable else logger.error
                log("beetle: cannot store a completion yet (%r); trying again", exc)
                self.stats["completion_retries"] += 1
                again = min(retry_s * 2, 5.0)
                self.call_later(
                    retry_s, lambda: self._complete(message, header, facts, claim, ack, again)
                )
                return
            if fence.ok:
                self.stats["completed"] += 1
                metrics.task_completed(facts.scope, (message.headers or {}).get("task"))
                runtime = header.get(RUNTIME_MARK)
                detail = {"runtime_ms": runtime} if runtime is not None else None
                pid = header.get(PID_MARK)
                self._trace_run("completed", facts, message, claim.attempt, detail, pid)
                if self._acking_after_trace():
                    # the ``completed`` event is written before the ack, once for the batch:
                    # a worker killed in between must not leave a trace that reads "lost"
                    self._acks_after_trace.append(ack)
                    return
            elif fence.status is not Status.COMPLETED:
                self.stats["lease_lost"] += 1
                header[COMPLETED_MARK] = False  # its twin goes through the gate again
                logger.warning(
                    "beetle: late completion of %s (%s) refused: its lease ran out and another "
                    "run took it over (stored status %s, token %s; this run held token %s)",
                    facts.message_id[:100],
                    facts.scope,
                    fence.status.value if fence.status else None,
                    fence.token,
                    claim.token,
                )
            ack()

        assert self.reads is not None
        self.reads.complete(facts, claim.token, answered)

    def _acking_after_trace(self) -> bool:
        """In a batch of replies, with tracing on: acks of settled messages wait for
        :meth:`after_batch`, which writes their events first."""
        return self._trace_before_ack and getattr(self.reads, "in_batch", False)

    def after_batch(self) -> None:
        """After a batch of Redis replies: write its outcome events, then make its acks."""
        self.tracer.flush_owed()
        acks, self._acks_after_trace = self._acks_after_trace, []
        for make_ack in acks:
            try:
                make_ack()
            except Exception:  # the connection went: the copy comes back, a duplicate
                logger.exception("beetle: cannot ack a completed message")

    def _release_later(self, facts: MessageFacts, owner: str) -> None:
        """Release a claim by its owner now, or once Redis answers again."""
        self._to_release.append((facts, owner))
        if not self.paused:
            self._release_unconfirmed_claims()

    def _remember_completed(self, key: tuple[str, str]) -> None:
        """Keep a run that completed here in mind for a while: its other copy usually
        arrives within milliseconds and can then be dropped without a Redis read. A
        completed record never changes, so the memory cannot be wrong, only forgotten."""
        completed = self._completed
        completed[key] = self.clock() + self.completed_memory_ms
        completed.move_to_end(key)
        while len(completed) > self.completed_memory_size:
            completed.popitem(last=False)

    def _completed_here(self, key: tuple[str, str]) -> bool:
        until = self._completed.get(key)
        if until is None:
            return False
        if until < self.clock():
            del self._completed[key]
            return False
        return True

    def _wake(self, waiters: list[Delivery | Twin]) -> None:
        for d in waiters:
            if isinstance(d, Twin):
                self._deliver_on(d)
            elif d.generation == self.generation:
                self._examine(d)

    def give_back_held(self) -> int:
        """Requeue now every waiting or parked copy that :attr:`handing_back` names (a
        waiting copy's twin may be held for hours, as an ETA task from another queue);
        deferred ones go back when they are next looked at. Returns how many."""
        given = 0
        for key, waiters in list(self._waiting.items()):
            back = [d for d in waiters if self.handing_back(d.message)]
            for d in back:
                waiters.remove(d)
                requeue(d.message)
            if not waiters:
                del self._waiting[key]
            given += len(back)
        back = [d for d in self._parked if self.handing_back(d.message)]
        self._parked = [d for d in self._parked if d not in back]
        for d in back:
            requeue(d.message)
        self.stats["given_back"] += given + len(back)
        return given + len(back)

    def hand_back(self, message: Any) -> str:
        """Requeue a delivery after a backoff (for a caller whose step failed)."""
        return self._hand_back(message, None)

    def _hand_back(self, message: Any, key: Any, delay_s: float | None = None) -> str:
        self.stats["handed_back"] += 1
        self.handbacks.requeue_later(message, key, delay_s)
        return "handed_back"

    def _drop(self, d: Delivery, event: str, status: Any = None) -> str:
        self.stats[event] += 1
        detail = {"status": status.value} if status is not None else None
        self._trace(event, d.facts.message_id, d.facts.scope, d.task_name, d.message, detail)
        if self._acking_after_trace():
            # a dropped copy's event is the audit's evidence of how it was settled (a
            # ``duplicate`` of a completed message whose own ``completed`` event died with its
            # worker, an ``expired``): written before the copy is acked away
            self._acks_after_trace.append(lambda: ack(d.message))
        else:
            ack(d.message)
        return event

    def _defer(self, d: Delivery, delay_ms: int, running: bool) -> str:
        """Hold ``d`` until the lease ends or the retry is due. A run elsewhere usually ends
        long before its lease does, so under a lease the copy is looked at again after
        50 ms, 100 ms, 200 ms, ... (not later than the lease's end): its ack, and the
        memory and prefetch slot it holds, need not wait for a lease sized for the worst
        case. Soon matters: a deferred copy holds a slot of the prefetch window until it
        is looked at again (the transport widens the window for it: kombu_beetle.prefetch,
        but only within max_deferred)."""
        self.stats["deferred"] += 1
        self.deferred += 1
        self.deferred_bytes += d.size
        qos = self.qos()
        within = (
            self.deferred <= self.max_deferred and self.deferred_bytes <= self.max_deferred_bytes
        )
        if qos is not None and within:
            qos.increment_eventually()
            d.qos = qos
        elif qos is not None:
            self.stats["deferred_past_bound"] += 1
        wait_s = max(delay_ms, 0) / 1000
        if running:
            wait_s = min(wait_s, self.recheck_min_s * 2**d.rechecks)
        d.rechecks += 1
        delay_s = min(wait_s, self.recheck_max_s) + 0.02
        detail = {"delay_s": round(delay_ms / 1000, 3)}
        self._trace("deferred", d.facts.message_id, d.facts.scope, d.task_name, d.message, detail)
        self.call_later(delay_s, lambda: self._recheck(d))
        return "deferred"

    def _recheck(self, d: Delivery) -> None:
        if d.generation != self.generation:
            return
        self.deferred -= 1
        self.deferred_bytes -= d.size
        if d.qos is not None:
            d.qos.decrement_eventually()
            d.qos = None
        if not channel_open(d.message):
            # its broker went away; the broker delivers it again when it comes back
            self.stats["forgotten"] += 1
            return
        self._examine(d)

    # -- Redis down --------------------------------------------------------------------------

    def _pause(self, exc: BaseException) -> None:
        if self.paused:
            return
        self.paused = True
        self.paused_at = time.monotonic()
        self.stats["pauses"] += 1
        logger.error(
            "beetle: the dedup store is unreachable (%r): no task runs without a claim, so this "
            "worker holds its deliveries unacked and takes no new ones until Redis answers",
            exc,
        )
        self.call_later(self.probe_interval_s, self._probe_tick)

    def _probe_tick(self) -> None:
        if not self.paused:
            return
        if not self.probe() or not self._release_unconfirmed_claims():
            self.call_later(self.probe_interval_s, self._probe_tick)
            return
        self.paused = False
        self.unavailable_s += time.monotonic() - self.paused_at
        parked, self._parked = self._parked, []
        logger.warning("beetle: the dedup store answers again; resuming %d deliveries", len(parked))
        for d in parked:
            if d.generation == self.generation:
                self._examine(d)

    def _release_unconfirmed_claims(self) -> bool:
        """Release the claims sent without an answer (their owner never ran the body); True
        once none is left. A release only spares the next copy the wait for the lease's end,
        so one Redis refuses for a reason other than being unavailable is given up."""
        while self._to_release:
            facts, owner = self._to_release[0]
            try:
                self.store.release(facts, 0, owner)
            except Exception as exc:
                if store_unavailable(exc):
                    logger.debug("beetle: cannot release %s's claim yet: %r", owner, exc)
                    return False
                logger.warning(
                    "beetle: cannot release %s's claim (%r); its lease ends it", owner, exc
                )
            self._to_release.pop(0)
        return True

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
