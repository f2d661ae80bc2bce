"""The claims the gate makes in its batches, from the hand-off to the pool to the ack.

On Celery's event loop the gate's call for a delivery is the claim itself (:mod:`.gate`),
and what it claims is a *reservation*
(:data:`~celery_beetle.store.outcome.RESERVATION_MS`): it keeps the other copies away but
counts no attempt. Two things follow, both pipelined in the gate's batches with the other
deliveries' calls:

- **renewals**: a delivery that waits for a pool process keeps its reservation, renewed every
  third of it (:meth:`~ClaimKeeping._reserve`), until its body begins (the pool's start
  replaces it with the run's lease) or its run ends. A worker killed with deliveries in its
  pool's queue leaves them to other copies within one reservation, their attempts unused.
- **completions before the ack**: a run that succeeded on the gate's claim is completed by
  the gate, and its copy acked only once that is stored, retried until it is
  (:meth:`~ClaimKeeping.complete_before_ack`). With tracing on, the acks of a batch wait
  until its outcome events are written (:meth:`~ClaimKeeping.after_batch`), so a worker
  killed in between never leaves a trace that reads "lost".
- **what is owed at a shutdown**: a completion not stored yet is *owed* until it is. A warm
  shutdown stores what is owed itself, retrying for a bounded time
  (:meth:`~ClaimKeeping.store_owed`), because the event loop that retries it stops with the
  worker; a body that returned is then not found unfinished by the next worker.

:class:`ClaimKeeping` is part of the gate (:class:`~celery_beetle.worker.gate.DeliveryGate`),
apart only so each module reads on its own (as :mod:`.bad_input`); what it uses of the gate is
named at its top.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery_beetle import metrics
from celery_beetle.store.health import store_unavailable
from celery_beetle.store.outcome import FenceDecision
from celery_beetle.store.state import MessageFacts, Status
from celery_beetle.worker.facts import (
    CLAIM_MARK,
    COMPLETED_MARK,
    FACTS_HEADER,
    PID_MARK,
    RUNTIME_MARK,
    GateClaim,
    facts_from_headers,
)

__all__ = ["ClaimKeeping"]

logger = logging.getLogger(__name__)


class ClaimKeeping:
    """Reservations renewed, completions stored before the ack: for
    :class:`~celery_beetle.worker.gate.DeliveryGate`."""

    # provided by the gate
    stats: Counter[str]
    paused: bool
    generation: int
    reads: Any
    tracer: Any
    clock: Callable[[], int]
    call_later: Callable[[float, Callable[[], None]], Any]
    completion_retry_s: float
    store: Any
    _owed: dict[int, tuple[Any, dict[str, Any], MessageFacts, GateClaim, Callable[[], None]]]
    _reserved: dict[tuple[str, str], tuple[MessageFacts, int, int]]
    _renewing: bool
    _trace_before_ack: bool
    _acks_after_trace: list[Callable[[], None]]

    if TYPE_CHECKING:

        def _pause(self, exc: BaseException) -> None: ...

        def _trace_run(
            self,
            event: str,
            facts: MessageFacts,
            message: Any,
            attempt: int,
            detail: dict[str, Any] | None,
            pid: int | None = None,
        ) -> None: ...

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
        key = id(message)
        self._owed[key] = (message, header, facts, claim, ack)
        self._send_completion(key, self.completion_retry_s)
        return True

    def _send_completion(self, key: int, retry_s: float) -> None:
        """Send an owed completion in the next batch; again after ``retry_s`` if it fails."""
        owed = self._owed.get(key)
        if owed is None:
            return  # stored at a shutdown meanwhile
        message, header, facts, claim, ack = owed

        def answered(fence: FenceDecision | None, exc: BaseException | None) -> None:
            if key not in self._owed:
                return  # stored at a shutdown meanwhile, and acked there
            if exc is not None or fence is None:
                # never ack what is not stored: again after a while, whatever the error
                unavailable = exc is not None and store_unavailable(exc)
                if unavailable:
                    self._pause(exc)  # type: ignore[arg-type]
                # an unavailable store is said by the pause; what is not understood, in full
                log = logger.debug if unavailable else logger.error
                log("beetle: cannot store a completion yet (%r); trying again", exc)
                self.stats["completion_retries"] += 1
                again = min(retry_s * 2, 5.0)
                self.call_later(retry_s, lambda: self._send_completion(key, again))
                return
            del self._owed[key]
            self._completed_with(fence, message, header, facts, claim, ack)

        assert self.reads is not None
        self.reads.complete(facts, claim.token, answered)

    def _completed_with(
        self,
        fence: FenceDecision,
        message: Any,
        header: dict[str, Any],
        facts: MessageFacts,
        claim: GateClaim,
        ack: Callable[[], None],
    ) -> None:
        """The stored answer to a completion: trace it and ack, or refuse a late one."""
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

    def store_owed(self, wait_s: float) -> tuple[int, int]:
        """Store the completions still owed, synchronously, retrying for up to ``wait_s``
        seconds while the store is unavailable, and ack each stored one. For a warm
        shutdown, when the event loop no longer retries them. Returns (stored, owed)."""
        owed = len(self._owed)
        if not owed:
            return 0, 0
        logger.info("beetle: stopping: storing %d completion(s) owed", owed)
        deadline = time.monotonic() + wait_s
        pause = self.completion_retry_s
        while self._owed:
            for key, (message, header, facts, claim, ack) in list(self._owed.items()):
                try:
                    fence = self.store.complete(facts, claim.token)
                except Exception as exc:
                    if not store_unavailable(exc):
                        logger.error("beetle: cannot store a completion (%r)", exc)
                    continue
                del self._owed[key]
                self._completed_with(fence, message, header, facts, claim, _quietly(ack))
            if not self._owed or time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        stored = owed - len(self._owed)
        if self._owed:
            logger.warning(
                "beetle: stopping: stored %d of %d owed completion(s) within %.0f s; the rest "
                "go back to their queues, and their bodies may run again",
                stored,
                owed,
                wait_s,
            )
            self._owed.clear()
        else:
            logger.info("beetle: stopping: stored the %d completion(s) owed", owed)
        return stored, owed

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


def _quietly(ack: Callable[[], None]) -> Callable[[], None]:
    """``ack`` for a shutdown: a connection already gone leaves the stored copy to be
    dropped as a duplicate when it comes back."""

    def acked() -> None:
        try:
            ack()
        except Exception:
            logger.debug("beetle: cannot ack a completed message at shutdown", exc_info=True)

    return acked
