"""The gate: what the worker's main process does with a BeetleTask delivery before the pool.

Every copy of every redundant message reaches the worker; only one may run.
The gate looks at each delivery with at most one Redis call, pipelined on the event loop.
It either hands the delivery to the task's strategy (and so to the pool) or keeps it from
ever taking a pool slot.
:doc:`/guides/gate-internals` tells the path of a delivery at length; this table is its map.

=================  =====================================================================
what it finds      verdict (:class:`~.verdict.Verdict`) and what the gate does
=================  =====================================================================
nothing, a lease   **run**: hand it to the strategy on the gate's reservation (or, after
that ran out, or   a read, for the pool to claim); under prefork a fresh copy waits for a
a retry now due    free process and is claimed in full for it (:mod:`.dispatch`)
completed, failed  **duplicate**: ack and drop; a completion here is remembered a minute
running elsewhere  **deferred**: keep it unacked, widen the prefetch window by one, and
or delayed         look again on a timer when the lease ends or the retry is due
its twin running   **waiting**: no Redis call; dropped once that run completes, sent
here               through the gate again after any other ending
expired            **expired**: ack and drop, without asking Redis
Redis unavailable  **parked**: keep it unacked and unprocessed, probe on a timer, and send
                   every parked copy through again once Redis answers (:mod:`.outage`)
bad input          **bad_input**: dead-letter it to ``<queue>.dead`` once, then ack
                   (:mod:`.bad_input`)
an error nobody    **handed_back**: log it in full and requeue it after a backoff (0.5 s,
foresaw            doubling to 30 s per message); never an ack
=================  =====================================================================

Rules:

- A copy leaves its queue only once its outcome or its dead letter is stored.
- A delivery's identity is ``(scope, message_id)``; copies that share it are one message.
- The gate writes its findings into the delivery's headers (:mod:`.facts`) for the pool.
- Nothing here imports Celery; the bootstep gives the gate its timer, QoS and strategies.

The gate wires its parts (:mod:`celery_beetle.worker` maps them) and reads as the path of a
delivery: :meth:`DeliveryGate.handle`, what it finds, what it decides.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_beetle.store import Store, wall_clock_ms
from celery_beetle.store.health import store_unavailable
from celery_beetle.store.outcome import Claim, GateDecision, Limits
from celery_beetle.store.outcome import Gate as Found
from celery_beetle.store.state import MessageFacts, Status
from celery_beetle.worker.asking import Asking
from celery_beetle.worker.bad_input import BadInput, BadInputs, DeadLetter
from celery_beetle.worker.deliveries import HELD_MARK, CompletedMemory, Delivery, Ending, QoSLike
from celery_beetle.worker.dispatch import FreeProcesses, PoolDispatch
from celery_beetle.worker.ending import Endings, RunEnding
from celery_beetle.worker.facts import CLAIM_MARK, FACTS_HEADER, GateClaim, facts_header
from celery_beetle.worker.gate_claims import ClaimKeeper
from celery_beetle.worker.handback import HandBacks, requeue
from celery_beetle.worker.held import Holding
from celery_beetle.worker.outage import StoreOutage
from celery_beetle.worker.settle import GateTrace, Settle
from celery_beetle.worker.verdict import Verdict
from kombu_beetle.scopes import scope_of
from kombu_beetle.trace import NullTracer

__all__ = ["BadInput", "DeadLetter", "DeliveryGate"]

logger = logging.getLogger(__name__)


@dataclass
class DeliveryGate:
    """The main-process gate. One per worker consumer; everything runs on its event loop.

    - ``store``: the dedup store (one ``gate()`` read per look without pipelined reads).
    - ``call_later(seconds, fn)``: a timer on the event loop (0 = soon).
    - ``qos()``: the consumer's prefetch QoS now (it changes when the consumer restarts).
    - ``dead_letter(message, queue, reason, detail)``: see :data:`~.bad_input.DeadLetter`.
    - ``queue_of(message)``: the queue a delivery was consumed from.
    - ``probe()``: True once Redis takes a write again.
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
    #: a copy deferred under a lease is looked at again after this, doubling up to the max
    recheck_min_s: float = 0.05
    recheck_max_s: float = 30.0
    probe_interval_s: float = 1.0
    #: the store as the logs name it (its URL, password masked)
    store_name: str = "redis"
    #: how many runs that completed here, and for how long, the gate remembers
    completed_memory_size: int = 10_000
    completed_memory_ms: int = 60_000
    worker: str | None = None
    #: the gate's counts, by verdict and by event (for the metrics and the logs)
    stats: Counter[str] = field(default_factory=Counter)
    #: pipelined calls on the event loop (:mod:`.gate_reads`); None: synchronous reads
    reads: Any = None
    #: past either bound, a deferred copy no longer widens the prefetch window
    max_deferred: int = 1_000
    max_deferred_bytes: int = 64 * 1024 * 1024
    #: an unknown task is handed back for this long after a worker first saw it
    unknown_task_grace_ms: int = 600_000
    #: hand-backs wait 0.5 s, doubling per message up to this
    handback_max_s: float = 30.0
    #: ``claims_for(message, task_name)``: the limits to claim with, or None to read
    claims_for: Callable[[Any, str], Limits | None] = field(default=lambda message, name: None)
    #: a completion that could not be stored is tried again after this, doubling to 5 s
    completion_retry_s: float = 0.1
    #: ``handing_back(message)``: True while its queue is handed back; requeued, not examined
    handing_back: Callable[[Any], bool] = field(default=lambda message: False)
    #: the prefork processes free now, and the tasks claimed in full for one (:mod:`.dispatch`)
    pool_free: FreeProcesses | None = None

    def __post_init__(self) -> None:
        self.trace = GateTrace(self.tracer, self.worker)
        self.settle = Settle(self.tracer, self.reads)
        if self.settle.after_trace:
            self.reads.after_batch = self.settle.after_batch
        self.handbacks = HandBacks(
            self.call_later, self.handback_max_s, self.completed_memory_size, stats=self.stats
        )
        self.outage = StoreOutage(
            store=self.store,
            probe=self.probe,
            call_later=self.call_later,
            resume=self._resume,
            stats=self.stats,
            store_name=self.store_name,
            probe_interval_s=self.probe_interval_s,
        )
        self.holding = Holding(
            stats=self.stats,
            trace=self.trace,
            settle=self.settle,
            call_later=self.call_later,
            qos=self.qos,
            examine=self._examine,
            handing_back=self._handing_back,
            outage=self.outage,
            scope_of_message=self._scope_of_message,
            completed=CompletedMemory(
                self.clock, self.completed_memory_size, self.completed_memory_ms
            ),
            max_deferred=self.max_deferred,
            max_deferred_bytes=self.max_deferred_bytes,
            recheck_min_s=self.recheck_min_s,
            recheck_max_s=self.recheck_max_s,
        )
        self.claim_keeper = ClaimKeeper(
            store=self.store,
            reads=self.reads,
            clock=self.clock,
            call_later=self.call_later,
            outage=self.outage,
            stats=self.stats,
            trace=self.trace,
            settle=self.settle,
            worker=self.worker,
            completion_retry_s=self.completion_retry_s,
        )
        self.bad_inputs = BadInputs(
            store=self.store,
            dead_letter=self.dead_letter,
            queue_of=self.queue_of,
            scope_of=self._scope_of,
            clock=self.clock,
            outage=self.outage,
            hand_back=self.handbacks.hand_back,
            delay_for=self.handbacks.delay_for,
            stats=self.stats,
            trace=self.trace,
            message_ttl_ms=self.message_ttl_ms,
            unknown_task_grace_ms=self.unknown_task_grace_ms,
        )
        self.endings = Endings(
            holding=self.holding,
            claim_keeper=self.claim_keeper,
            outage=self.outage,
            handbacks=self.handbacks,
            stats=self.stats,
            call_later=self.call_later,
        )
        self.asking = Asking(
            reads=self.reads,
            clock=self.clock,
            claims_for=self._claims_for,
            holding=self.holding,
            claim_keeper=self.claim_keeper,
            outage=self.outage,
            stats=self.stats,
            decide=self._decide,
            run=self._run,
            trouble=self._trouble,
        )
        self.dispatch = PoolDispatch(
            pool=lambda: self.pool_free,
            claims_for=self._claims_for,
            asking=self.asking,
            holding=self.holding,
            outage=self.outage,
            handing_back=self._handing_back,
            clock=self.clock,
            examine=self._examine,
            stats=self.stats,
        )

    # -- what the bootstep and the transport call --------------------------------------------

    def handle(self, message: Any, task_name: str, start: Callable[[Ending], None]) -> Verdict:
        """Gate one delivery; ``start(ending)`` hands it to Celery and never raises.

        The run's :class:`~.ending.RunEnding` must be told how it ended.
        Nothing raises out of here: an error nobody foresaw hands the delivery back.
        """
        if not (getattr(message, "delivery_info", None) or {}).get(HELD_MARK):
            self.stats["delivered"] += 1  # a held twin sent on was counted as it arrived
        try:
            return self._handle(message, task_name, start)
        except Exception:
            logger.exception("beetle: the gate failed on a %s delivery; handing it back", task_name)
            self.stats[Verdict.ERROR] += 1
            return self.handbacks.hand_back(message, None)

    def hold_twin(self, raw: Any, task_name: str, deliver: Callable[[Any], Any]) -> bool:
        """The transport's delivery filter (:meth:`~.held.Holding.hold_twin`)."""
        return self.holding.hold_twin(raw, task_name, deliver)

    def complete_before_ack(
        self, message: Any, ack: Callable[[], None], requeue: Callable[[], None] | None = None
    ) -> bool:
        """Store the completion of a run on the gate's claim (:mod:`.gate_claims`), then
        ``ack()``; True if so. Its process is free: the next claim joins the batch."""
        storing = self.claim_keeper.complete_before_ack(message, ack, requeue)
        self.dispatch.pump()
        return storing

    def drain_while_stopping(self) -> None:
        """A warm shutdown began (:meth:`~.ClaimKeeper.drain_while_stopping`)."""
        self.claim_keeper.drain_while_stopping()

    def store_owed(self, wait_s: float) -> tuple[int, int]:
        """At a warm shutdown: store the completions owed (:meth:`~.ClaimKeeper.store_owed`)."""
        return self.claim_keeper.store_owed(wait_s)

    def unknown_task(self, message: Any, task_name: str, detail: str) -> Verdict:
        """A task this worker does not know (:meth:`~.bad_input.BadInputs.unknown_task`)."""
        return self.bad_inputs.unknown_task(message, task_name, detail)

    def hand_back(self, message: Any) -> Verdict:
        """Requeue a delivery after a backoff (for a caller whose step failed)."""
        return self.handbacks.hand_back(message, None)

    def give_back_held(self) -> int:
        """Requeue now every held copy whose queue is handed back; returns how many."""
        return self.holding.give_back_held()

    def pause_if_unreachable(self) -> bool:
        """Probe the store once, as the worker starts; True if the gate paused."""
        return self.outage.pause_if_unreachable()

    def reset(self) -> None:
        """Forget every held delivery: the consumer's connection is going away (redelivered)."""
        if self.reads is not None:
            self.reads.close()  # the consumer's restart also empties the event loop
        self.holding.reset()
        self.claim_keeper.reset()
        self.dispatch.reset()

    @property
    def paused(self) -> bool:
        """True while the store is unavailable."""
        return self.outage.paused

    @property
    def held(self) -> int:
        """Deliveries waiting for a twin or parked (deferred ones sit on timers)."""
        return self.holding.held

    @property
    def claims(self) -> Counter[Claim]:
        """The gate's claims by outcome."""
        return self.claim_keeper.claims

    # -- the path of a delivery ---------------------------------------------------------------

    def _handle(self, message: Any, task_name: str, start: Callable[[Ending], None]) -> Verdict:
        queue = self.queue_of(message)
        message_id = (message.properties or {}).get("message_id")
        scope = scope_of(self.scopes, queue)
        info = message.delivery_info if message.delivery_info is not None else {}
        held = info.pop(HELD_MARK, False)
        if not held and self.trace.enabled:  # a held twin sent on was traced as it arrived
            self.trace.delivered(str(message_id or "")[:200], scope, task_name, message)
        facts = self.bad_inputs.admit(message, message_id, queue, scope, task_name)
        if not isinstance(facts, MessageFacts):  # bad input: dead-lettered, or handed back
            return facts
        if message.headers is not None:
            message.headers[FACTS_HEADER] = facts_header(facts)
        body = getattr(message, "body", b"")
        size = len(body) if isinstance(body, (bytes, str)) else 0
        d = Delivery(message, task_name, facts, start, self.holding.generation, size=size)
        if facts.expires_at_ms <= self.clock():
            return self.holding.drop(d, Verdict.EXPIRED)
        return self._examine(d, fresh=not (held or info.get("redelivered")))

    def _examine(self, d: Delivery, fresh: bool = False) -> Verdict:
        """Look at ``d``: first what the gate knows, then (if it must) Redis."""
        holding = self.holding
        if self.handing_back(d.message):
            self.stats[Verdict.GIVEN_BACK] += 1
            requeue(d.message)
            return Verdict.GIVEN_BACK
        if self.outage.paused:
            return holding.park(d)
        if d.key in holding.in_flight:
            return holding.wait(d.key, d)
        if d.key in holding.completed:
            self.stats["known_completed"] += 1
            return holding.drop(d, Verdict.DUPLICATE, Status.COMPLETED)
        if self.reads is not None:
            if fresh and (verdict := self.dispatch.offer(d)) is not None:
                return verdict
            return self.asking.ask(d)
        try:
            decision = self.store.gate(d.facts)
        except Exception as exc:
            return self._trouble(d, exc)
        return self._decide(d, decision)

    def _decide(self, d: Delivery, decision: GateDecision) -> Verdict:
        """Go on from what a read found (:func:`~celery_beetle.store.outcome.decide_gate`)."""
        if decision.outcome is Found.RUN:
            return self._run(d)
        if decision.outcome is Found.DROP_DUPLICATE:
            if decision.status is Status.COMPLETED:
                self.holding.completed.remember(d.key)  # its twin here then costs no read
            return self.holding.drop(d, Verdict.DUPLICATE, decision.status)
        if decision.outcome is Found.DROP_EXPIRED:
            return self.holding.drop(d, Verdict.EXPIRED)
        return self.holding.defer(d, decision.delay_ms, running=decision.status is Status.RUNNING)

    def _run(self, d: Delivery, claim: GateClaim | None = None) -> Verdict:
        """Hand ``d`` to Celery's strategy, with the gate's claim in its headers if any."""
        self.holding.in_flight.add(d.key)
        self.stats[Verdict.RUN] += 1
        if claim is not None:
            header = (d.message.headers or {}).get(FACTS_HEADER)
            if isinstance(header, dict):
                header[CLAIM_MARK] = claim.mark()
        d.start(RunEnding(self.endings, d))
        return Verdict.RUN

    # -- when the gate cannot go on -----------------------------------------------------------

    def _trouble(self, d: Delivery, exc: BaseException) -> Verdict:
        """Asking about ``d`` failed: park it and pause if the store is unavailable;
        otherwise (a bug, a record nobody can read) hand it back, logged in full."""
        if store_unavailable(exc):
            self.outage.pause(exc)
            return self.holding.park(d)
        logger.error(
            "beetle: cannot gate %s (%s, %s); handing it back",
            d.task_name,
            d.facts.scope,
            d.facts.message_id[:100],
            exc_info=exc,
        )
        self.stats[Verdict.ERROR] += 1
        return self.handbacks.hand_back(d.message, d.key)

    def _resume(self) -> None:
        """The store answers again: every parked delivery goes through the gate again."""
        for d in self.holding.take_parked():
            self._examine(d)

    # -- what the parts read of the gate -----------------------------------------------------

    def _scope_of(self, queue: str) -> str:
        return scope_of(self.scopes, queue)

    def _scope_of_message(self, message: Any) -> str:
        return scope_of(self.scopes, self.queue_of(message))

    def _claims_for(self, message: Any, task_name: str) -> Limits | None:
        return self.claims_for(message, task_name)

    def _handing_back(self, message: Any) -> bool:
        return self.handing_back(message)  # replaced at runtime by the hand-back step
