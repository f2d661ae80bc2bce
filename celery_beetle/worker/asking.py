"""The gate's question to Redis on the event loop, and what it does with the answer.

The question rides in the next pipelined batch (:mod:`.gate_reads`); the delivery goes on
from the reply.
Where the gate may claim (``claims_for``), the question is the claim itself: a
*reservation* (:data:`~celery_beetle.store.outcome.RESERVATION_MS`) that keeps other copies
away and counts no attempt.
Otherwise it is a read, and the pool claims.
A twin that arrives meanwhile waits for this answer instead of asking again.

==============  ==========================================================================
claim outcome   what the gate does
==============  ==========================================================================
acquired        run, holding the reservation (renewed by :mod:`.gate_claims`)
dead_letter     run, for the pool to publish the dead letter the claim owes
already_done    drop as a duplicate (a completion is remembered)
expired         drop as expired
locked          defer, looking again soon (the run elsewhere usually ends early)
delayed         defer until the retry is due
==============  ==========================================================================

A claim whose answer is lost, or that answers a consumer restarted since, is released by
its owner (now, or once Redis answers again), so the next copy need not wait for its lease.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from celery_beetle.store.outcome import (
    RESERVATION_MS,
    Claim,
    ClaimDecision,
    GateDecision,
    Limits,
    decide_gate,
)
from celery_beetle.store.outcome import Gate as Found
from celery_beetle.worker.deliveries import Delivery
from celery_beetle.worker.facts import GateClaim
from celery_beetle.worker.gate_claims import ClaimKeeper
from celery_beetle.worker.held import Holding
from celery_beetle.worker.outage import StoreOutage
from celery_beetle.worker.verdict import Verdict

__all__ = ["Asking"]


class Asking:
    """Ask Redis about a delivery without waiting; go on from the answer.

    - ``reads``: the pipelined calls (:class:`~.gate_reads.PipelinedReads`).
    - ``clock()``: wall-clock milliseconds.
    - ``claims_for(message, task_name)``: the limits to claim with, or None to read.
    - ``holding``, ``claim_keeper``, ``outage``: the gate's parts.
    - ``decide(d, decision)``, ``run(d, claim)``, ``trouble(d, exc)``: the gate's next steps.
    """

    def __init__(
        self,
        *,
        reads: Any,
        clock: Callable[[], int],
        claims_for: Callable[[Any, str], Limits | None],
        holding: Holding,
        claim_keeper: ClaimKeeper,
        outage: StoreOutage,
        stats: Counter[str],
        decide: Callable[[Delivery, GateDecision], Verdict],
        run: Callable[[Delivery, GateClaim], Verdict],
        trouble: Callable[[Delivery, BaseException], Verdict],
    ) -> None:
        self.reads = reads
        self.clock = clock
        self.claims_for = claims_for
        self.holding = holding
        self.claim_keeper = claim_keeper
        self.outage = outage
        self.stats = stats
        self.decide = decide
        self.run = run
        self.trouble = trouble

    def ask(self, d: Delivery) -> Verdict:
        """Send the claim (or the read) of ``d`` in the next batch."""
        now = self.clock()
        if d.facts.expires_at_ms <= now:
            return self.decide(d, decide_gate(None, d.facts, now))
        limits = self.claims_for(d.message, d.task_name)
        self.holding.in_flight.add(d.key)
        if limits is None:
            self.reads.read(d.facts, partial(self._answered, d, "", 0))
            return Verdict.READING
        owner = self.claim_keeper.next_owner()
        reserve_ms = min(RESERVATION_MS, limits.lease_timeout_ms)
        answered = partial(self._answered, d, owner, reserve_ms)
        self.reads.claim(d.facts, limits, owner, answered, reserve_ms=reserve_ms)
        return Verdict.READING

    def start(self, d: Delivery, limits: Limits, answered: Callable[[], None]) -> None:
        """Claim ``d`` in full for a pool process that is free (:mod:`.dispatch`): the
        attempt counts now and the whole lease begins; ``answered()`` once Redis replies."""
        self.holding.in_flight.add(d.key)
        owner = self.claim_keeper.next_owner()
        sent_at = time.monotonic()  # the batch goes out later: the lease begins after this
        claimed = partial(self._answered, d, owner, 0, sent_at=sent_at, answered=answered)
        self.reads.claim(d.facts, limits, owner, claimed, reserve_ms=0)

    def send_now(self) -> None:
        """Write the claims asked so far without waiting for the loop's next pass."""
        self.reads.write_now()

    def _answered(
        self,
        d: Delivery,
        owner: str,
        reserve_ms: int,
        answer: Any,
        exc: BaseException | None,
        sent_at: float = 0.0,
        answered: Callable[[], None] | None = None,
    ) -> None:
        """Redis answered the question about ``d`` (``owner``: it was a claim; ``sent_at``:
        a claim in full for a free pool process, ``answered()`` told first)."""
        if answered is not None:
            answered()
        holding = self.holding
        if d.generation != holding.generation:
            # the consumer restarted: this delivery cannot be acked; a claim made for it
            # (or maybe made: no reply) is released, so its redelivery need not wait
            if owner and (exc is not None or answer.outcome is Claim.ACQUIRED):
                self.outage.release_later(d.facts, owner)
            return
        key = d.key
        holding.in_flight.discard(key)
        waiters = holding.waiting.pop(key, [])
        if exc is not None:
            self.trouble(d, exc)
            holding.each_waiter(waiters, holding.deliver_on, partial(self._trouble, exc))
            if owner:  # the claim may have been applied without its reply arriving
                self.outage.release_later(d.facts, owner)
            return
        try:
            if owner:
                self._claimed(d, answer, owner, reserve_ms, sent_at)
            else:
                self.decide(d, decide_gate(answer, d.facts, self.clock()))
        except Exception as error:
            self.trouble(d, error)
        if not waiters:
            return
        if key in holding.in_flight:  # it went to the pool: they wait for its run
            holding.waiting.setdefault(key, []).extend(waiters)
        else:  # dropped or deferred: each looks again (a completion is remembered)
            holding.wake(waiters)

    def _trouble(self, exc: BaseException, d: Delivery) -> None:
        self.trouble(d, exc)

    def _claimed(
        self,
        d: Delivery,
        claim: ClaimDecision,
        owner: str,
        reserve_ms: int = RESERVATION_MS,
        sent_at: float = 0.0,
    ) -> Verdict:
        """Go on from the gate's claim as the pool would have (:class:`~.run.Run`)."""
        outcome = claim.outcome
        self.claim_keeper.claims[outcome] += 1
        if outcome is Claim.ACQUIRED:
            if claim.taken_over:
                self.stats["taken_over"] += 1
            given = GateClaim(
                owner, claim.token, claim.attempt, claim.lease_deadline_ms,
                started=bool(sent_at), sent_at=sent_at,
            )  # fmt: skip
            self.claim_keeper.reserve(d.key, d.facts, claim.token, reserve_ms)
            return self.run(d, given)
        if outcome is Claim.DEAD_LETTER:  # the pool publishes it, as for its own claim
            reason = claim.reason or "attempts_limit"
            given = GateClaim(
                owner, attempt=claim.attempt, dead_letter=reason, exceptions=claim.exceptions
            )
            return self.run(d, given)
        if outcome is Claim.ALREADY_DONE:
            return self.decide(d, GateDecision(Found.DROP_DUPLICATE, status=claim.status))
        if outcome is Claim.EXPIRED:
            return self.holding.drop(d, Verdict.EXPIRED)
        return self.holding.defer(d, claim.delay_ms, running=outcome is Claim.LOCKED)
