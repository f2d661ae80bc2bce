"""The lease a run takes before its body: the gate's reservation started, or a claim of its own.

==================  =======================================================================
the gate's claim    what the pool does
==================  =======================================================================
in full (started)   **nothing** before the body: the gate claimed it for this free process
                    (:mod:`.dispatch`), the attempt counted and the full lease begun
a reservation       **start** as the body begins (one round trip): the attempt counts and
                    the full lease begins; a reservation taken over meanwhile hands the
                    copy back to the gate
none                **claim** before the body and complete after it (two round trips)
==================  =======================================================================

Rules:

- A claim or start is retried for a few seconds under the same owner, then the copy is
  handed back (:class:`~.run_calls.RetriedCalls`).
- Under prefork the body's time limits count from the sending of the call that set the
  lease, never from the moment the pool process took the job (:mod:`.time_limits`).
- A message that will not run (done, expired, locked, due later, or to be dead-lettered)
  raises what Celery must see instead of running the body.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NoReturn

from billiard.process import current_process

from celery_beetle import metrics
from celery_beetle.store import Store
from celery_beetle.store.outcome import Claim, GiveUpReason, Limits
from celery_beetle.store.state import MessageFacts, Status
from celery_beetle.worker import run_state, time_limits
from celery_beetle.worker.errors import Deferred, Dropped
from celery_beetle.worker.facts import GateClaim
from celery_beetle.worker.run_calls import RetriedCalls

__all__ = ["GiveUp", "Lease", "RunClaim"]

logger = logging.getLogger(__name__)

#: publishes the dead letter of a message that will not run, then raises:
#: ``(reason, attempt, exceptions)``
GiveUp = Callable[[str, int, int | None], NoReturn]


@dataclass(frozen=True)
class Lease:
    """The lease a body runs on, held by ``owner`` under the fencing ``token``."""

    owner: str
    token: int = 0
    attempt: int = 0
    deadline_ms: int = 0
    #: the gate stores the completion, before its ack
    gate_completes: bool = False


class RunClaim:
    """Takes one run's lease before its body, or raises what Celery must see instead.

    ``trace(event, **detail)`` notes a duplicate or an expiry; ``give_up`` publishes the
    dead letter of a message that will not run. ``acks_late`` off means an early ack,
    which proves nothing: such a run completes in the pool, never through the gate.
    """

    def __init__(
        self,
        store: Store,
        facts: MessageFacts,
        limits: Limits,
        calls: RetriedCalls,
        *,
        name: str,
        acks_late: bool,
        trace: Callable[..., None],
        give_up: GiveUp,
    ) -> None:
        self.store = store
        self.facts = facts
        self.limits = limits
        self.calls = calls
        self.name = name
        self.acks_late = acks_late
        self.trace = trace
        self.give_up = give_up

    def before_the_body(self, given: GateClaim | None, owner: str) -> Lease:
        """The lease, started on the gate's reservation ``given`` or claimed under ``owner``;
        the body's time limits count from the call that set it."""
        waiting = time.monotonic()
        time_limits.waiting_on_the_store(waiting)
        counts_from = waiting
        try:
            lease = self._start(given) if given is not None else self._claim(owner)
            if current_process().name == "MainProcess":
                return lease  # solo, threads, gevent: no time limits, a lease keeper
            sent = self.calls.sent
            if given is not None and given.started and given.sent_at:
                sent = min(given.sent_at, waiting)  # the gate's claim set the lease
            counts_from, deadline_ms = time_limits.lease_for_the_body(
                self.store, self.facts, lease.token, self.limits, sent, self.name
            )
            return replace(lease, deadline_ms=deadline_ms) if deadline_ms else lease
        finally:
            time_limits.limits_count_from(counts_from)

    def _claim(self, owner: str) -> Lease:
        """A claim of its own (a start at once), retried under ``owner``."""
        claim = self.calls(
            lambda: self.store.claim(self.facts, self.limits, owner), "claim", owner
        )  # fmt: skip
        outcome = claim.outcome
        metrics.pool_claim(outcome.value)
        if outcome is Claim.ACQUIRED:
            if claim.taken_over:
                metrics.lease_taken_over()
            return Lease(owner, claim.token, claim.attempt, claim.lease_deadline_ms)
        if outcome is Claim.ALREADY_DONE:
            self.trace("duplicate", status=claim.status.value if claim.status else None)
            raise Dropped("duplicate")
        if outcome is Claim.EXPIRED:
            self.trace("expired")
            raise Dropped("expired")
        if outcome in (Claim.LOCKED, Claim.DELAYED):
            # another worker claimed it since the gate looked: hand the copy back, the gate
            # defers it until that lease ends or the retry is due
            raise Deferred(f"{outcome.value} for {claim.delay_ms} ms")
        # DEAD_LETTER: it will not run; this run publishes its dead letter
        self.give_up(
            claim.reason or GiveUpReason.ATTEMPTS_LIMIT.value, claim.attempt, claim.exceptions
        )

    def _start(self, given: GateClaim) -> Lease:
        """The body begins on the gate's reservation.

        One round trip counts the attempt and starts the full lease (``start.lua``): an
        attempt is a body that began, and a delivery that only waited in the pool's queue
        uses none. A reservation another copy took over meanwhile (it ran out: this
        worker's event loop stood still, or Redis was away) is not ours: the copy goes back
        to the gate, which drops it once the message is done.
        """
        if given.dead_letter:
            self.give_up(given.dead_letter, given.attempt, given.exceptions)
        gate_completes = self.acks_late and not run_state.on_the_event_loop()
        if given.started:  # claimed in full for this free process: the attempt is counted
            return Lease(given.owner, given.token, given.attempt, given.deadline_ms, gate_completes)
        fence = self.calls(
            lambda: self.store.start(self.facts, given.token, self.limits), "start", given.owner
        )
        if fence.ok:
            attempt = fence.attempt or given.attempt
            return Lease(given.owner, given.token, attempt, fence.lease_deadline_ms, gate_completes)
        metrics.pool_claim(Claim.LOCKED.value)
        if fence.status is Status.COMPLETED:
            self.trace("duplicate", status=fence.status.value)
            raise Dropped("duplicate")
        logger.warning(
            "beetle: %s: the gate's reservation was taken over before the body began "
            "(stored status %s); handing the copy back",
            self.name,
            fence.status.value if fence.status else None,
        )
        raise Deferred("reservation taken over before the body began")
