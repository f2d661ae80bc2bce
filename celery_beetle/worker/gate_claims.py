"""The claim keeper: the gate's claims, from the hand-off to the pool to the ack.

On Celery's event loop the gate's call for a delivery is the claim itself (:mod:`.gate`).
What it claims is a *reservation* (:data:`~celery_beetle.store.outcome.RESERVATION_MS`).
A reservation keeps the other copies away but counts no attempt.
Two calls follow, pipelined in the gate's batches with the other deliveries' calls.

===========  ===========================================================================
call         rule
===========  ===========================================================================
renew        a delivery waiting for a pool process keeps its reservation, renewed every
             third of it, until its body begins (the pool's start sets the run's lease)
             or its run ends
complete     a run that succeeded on the gate's claim is completed here; its copy is
             acked only once the completion is stored, retried until it is
===========  ===========================================================================

A completion refused because another run took the message over acks its copy.
One refused because the store has no record of the message at all (a Redis failover lost
the claim) sends its copy back to its queue instead: no run holds the message, and its twin
may be gone with its broker, so the body runs again rather than the message being lost.

A completion not stored yet is *owed* until it is. A warm shutdown stops the event loop
while the pool finishes: a thread stores each owed completion meanwhile, before its lease
runs out (:meth:`ClaimKeeper.drain_while_stopping`), and what is left at the end is stored
for a bounded time (:meth:`ClaimKeeper.store_owed`).

A worker killed with deliveries in its pool's queue leaves them to other copies within one
reservation, their attempts unused.
With tracing on, the ack of a completion waits for its ``completed`` event (:mod:`.settle`).
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from celery_beetle import metrics
from celery_beetle.store import Store
from celery_beetle.store.health import store_unavailable
from celery_beetle.store.outcome import Claim, FenceDecision
from celery_beetle.store.state import MAX_OWNER_LENGTH, MessageFacts, Status
from celery_beetle.worker.facts import (
    CLAIM_MARK,
    COMPLETED_MARK,
    FACTS_HEADER,
    PID_MARK,
    RUNTIME_MARK,
    GateClaim,
    facts_from_headers,
)
from celery_beetle.worker.outage import StoreOutage
from celery_beetle.worker.settle import GateTrace, Settle

__all__ = ["ClaimKeeper"]

logger = logging.getLogger(__name__)

#: a completion that could not be stored is tried again after at most this long: as the pool
#: does (``run.OUTCOME_RETRY_MAX_S``), so that one waiting out a Redis outage is stored within
#: half a second of Redis taking writes again, and not lost to its lease ending meanwhile
COMPLETION_RETRY_MAX_S = 0.5


@dataclass(eq=False)
class _Completion:
    """A completion the gate stores before it acks its copy."""

    message: Any
    header: dict[str, Any]
    facts: MessageFacts
    claim: GateClaim
    ack: Callable[[], None]
    #: sends the copy back to its queue unacked, and the run has ended (None: ack it)
    requeue: Callable[[], None] | None = None


class ClaimKeeper:
    """Claims' owners, reservations renewed, completions stored before the ack.

    - ``store``: the dedup store, for what is owed at a shutdown (:meth:`store_owed`).
    - ``reads``: the pipelined calls (:mod:`.gate_reads`); None: the pool claims and completes.
    - ``clock()``: wall-clock milliseconds.
    - ``call_later(seconds, fn)``: a timer on the event loop.
    - ``outage``: the store's outage (``paused``; ``pause(exc)`` as a completion finds it).
    - ``stats``, ``trace``, ``settle``: the gate's counts, trace writer and ack rule.
    """

    def __init__(
        self,
        *,
        store: Store,
        reads: Any,
        clock: Callable[[], int],
        call_later: Callable[[float, Callable[[], None]], Any],
        outage: StoreOutage,
        stats: Counter[str],
        trace: GateTrace,
        settle: Settle,
        worker: str | None = None,
        completion_retry_s: float = 0.1,
    ) -> None:
        self.store = store
        self.reads = reads
        self.clock = clock
        self.call_later = call_later
        self.outage = outage
        self.stats = stats
        self.trace = trace
        self.settle = settle
        self.completion_retry_s = completion_retry_s
        #: the gate's claims by outcome (for the metrics)
        self.claims: Counter[Claim] = Counter()
        self._count = 0
        self._owner_base = f"{secrets.token_hex(3)}@{worker or socket.gethostname()}"
        #: completions not stored yet, by ``id(message)``: owed until stored
        self._owed: dict[int, _Completion] = {}
        #: reservations of deliveries handed to the pool, renewed until their run ends:
        #: identity -> (facts, token, reservation ms)
        self._reserved: dict[tuple[str, str], tuple[MessageFacts, int, int]] = {}
        self._renewing = False
        #: the thread storing completions during a warm shutdown, and its stop
        self._drainer: tuple[threading.Thread, threading.Event] | None = None

    def next_owner(self) -> str:
        """A claim's owner, unique per claim.

        The counter comes first: the store keeps at most
        :data:`~celery_beetle.store.state.MAX_OWNER_LENGTH` characters.
        """
        self._count += 1
        return f"{self._count:x}.{self._owner_base}"[:MAX_OWNER_LENGTH]

    def reset(self) -> None:
        """Forget the reservations: the consumer's connection is going away."""
        self._reserved.clear()

    # -- reservations ------------------------------------------------------------------------

    def reserve(self, key: tuple[str, str], facts: MessageFacts, token: int, ms: int) -> None:
        """Keep the reservation of a delivery handed to the pool alive while it waits for a
        pool process; renewals ride in the batches, every third of a reservation."""
        if ms <= 0 or self.reads is None:
            return
        self._reserved[key] = (facts, token, ms)
        if not self._renewing:
            self._renewing = True
            self.call_later(ms / 3000, self._renew_reservations)

    def unreserve(self, key: tuple[str, str]) -> None:
        """The run of ``key`` ended: its reservation needs no more renewals."""
        self._reserved.pop(key, None)

    def _renew_reservations(self) -> None:
        self._renewing = False
        if not self._reserved or self.reads is None:
            return
        # while Redis is away the reservations may run out: the pool's start then finds
        # out, and hands its delivery back if another copy took it
        if not self.outage.paused:
            for key, (facts, token, ms) in list(self._reserved.items()):
                self.reads.renew(facts, token, ms, partial(self._renewed, key, token))
        self._renewing = True
        shortest = min(ms for _, _, ms in self._reserved.values())
        self.call_later(shortest / 3000, self._renew_reservations)

    def _renewed(
        self,
        key: tuple[str, str],
        token: int,
        fence: FenceDecision | None,
        exc: BaseException | None,
    ) -> None:
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

    # -- completions -------------------------------------------------------------------------

    def complete_before_ack(
        self,
        message: Any,
        ack: Callable[[], None],
        requeue: Callable[[], None] | None = None,
    ) -> bool:
        """Store the completion of a run that succeeded on the gate's claim, then ``ack()``;
        True if so. False: nothing to store here (the pool stored the outcome), ack now.

        ``requeue()`` sends the copy back instead, if the store has no record left to
        complete (:meth:`_refused`)."""
        header = (message.headers or {}).get(FACTS_HEADER)
        if not isinstance(header, dict) or not header.get(COMPLETED_MARK):
            return False
        claim = GateClaim.from_mark(header.get(CLAIM_MARK))
        facts = facts_from_headers(header)
        if claim is None or not claim.token or facts is None or self.reads is None:
            return False
        key = id(message)
        self._owed[key] = _Completion(message, header, facts, claim, ack, requeue)
        self._send_completion(key, self.completion_retry_s)
        return True

    def _send_completion(self, key: int, retry_s: float) -> None:
        """Send an owed completion in the next batch; again after ``retry_s`` if it fails."""
        completion = self._owed.get(key)
        if completion is None:
            return  # stored at a shutdown meanwhile
        answered = partial(self._completed, key, retry_s)
        self.reads.complete(completion.facts, completion.claim.token, answered)

    def _completed(
        self, key: int, retry_s: float, fence: FenceDecision | None, exc: BaseException | None
    ) -> None:
        completion = self._owed.get(key)
        if completion is None:
            return  # stored at a shutdown meanwhile, and acked there
        if exc is not None or fence is None:
            self._retry(key, retry_s, exc)
            return
        if self._owed.pop(key, None) is not None:  # else stored by a shutdown's drain
            self._answered(completion, fence)

    def _answered(self, completion: _Completion, fence: FenceDecision) -> None:
        if fence.ok:
            self._stored(completion)
        else:
            self._refused(completion, fence)

    def _retry(self, key: int, retry_s: float, exc: BaseException | None) -> None:
        """Never ack what is not stored: try again after a while, whatever the error."""
        unavailable = exc is not None and store_unavailable(exc)
        if unavailable:
            self.outage.pause(exc)  # type: ignore[arg-type]
        # an unavailable store is said by the pause; what is not understood, in full
        log = logger.debug if unavailable else logger.error
        log("beetle: cannot store a completion yet (%r); trying again", exc)
        self.stats["completion_retries"] += 1
        again = min(retry_s * 2, COMPLETION_RETRY_MAX_S)
        self.call_later(retry_s, partial(self._send_completion, key, again))

    def _stored(self, completion: _Completion) -> None:
        """The completion is stored: write its event, then ack (:class:`~.settle.Settle`)."""
        message, header, facts = completion.message, completion.header, completion.facts
        self.stats["completed"] += 1
        metrics.task_completed(facts.scope, (message.headers or {}).get("task"))
        runtime = header.get(RUNTIME_MARK)
        detail = {"runtime_ms": runtime} if runtime is not None else None
        self.trace.write(
            "completed",
            facts.message_id,
            facts.scope,
            message,
            detail=detail,
            attempt=completion.claim.attempt,
            pid=header.get(PID_MARK),
        )
        self.settle(completion.ack)

    def _refused(self, completion: _Completion, fence: FenceDecision) -> None:
        """A late completion: its lease ran out and another run took it over. The copy is
        acked; unless the message completed, its twin goes through the gate again.

        With no record at all, nobody took it over: a Redis failover lost the claim. Then
        the copy goes back to its queue, as its twin may be gone, and the body runs again.
        """
        if fence.status is Status.COMPLETED:
            completion.ack()
            return
        facts = completion.facts
        completion.header[COMPLETED_MARK] = False
        if fence.record_lost and completion.requeue is not None:
            self.stats["record_lost"] += 1
            logger.warning(
                "beetle: completion of %s (%s) refused: the store has no record of it (a "
                "Redis failover lost its claim; this run held token %s); the copy goes back "
                "to its queue, and its body may run again",
                facts.message_id[:100],
                facts.scope,
                completion.claim.token,
            )
            completion.requeue()
            return
        self.stats["lease_lost"] += 1
        logger.warning(
            "beetle: late completion of %s (%s) refused: its lease ran out and another "
            "run took it over (stored status %s, token %s; this run held token %s)",
            facts.message_id[:100],
            facts.scope,
            fence.status.value if fence.status else None,
            fence.token,
            completion.claim.token,
        )
        completion.ack()

    # -- at a shutdown -----------------------------------------------------------------------

    def drain_while_stopping(self, interval_s: float = 0.1) -> None:
        """A warm shutdown began: store what is owed every ``interval_s`` on a thread."""
        if self._drainer is not None:
            return
        stop = threading.Event()
        thread = threading.Thread(target=self._drain, args=(stop, interval_s), daemon=True)
        self._drainer = (thread, stop)
        thread.start()

    def _drain(self, stop: threading.Event, interval_s: float) -> None:
        while not stop.wait(interval_s):
            self._store_owed_once()

    def _store_owed_once(self) -> None:
        """Try each owed completion once, synchronously; ack (or requeue) what is answered."""
        for key, completion in list(self._owed.items()):
            try:
                fence = self.store.complete(completion.facts, completion.claim.token)
            except Exception as exc:
                if not store_unavailable(exc):
                    logger.error("beetle: cannot store a completion (%r)", exc)
                continue
            # storing twice with one token changes nothing; acking twice would
            if self._owed.pop(key, None) is not None:
                self._answered_quietly(completion, fence)

    def _answered_quietly(self, completion: _Completion, fence: FenceDecision) -> None:
        """As :meth:`_answered`, at a shutdown: a failed ack leaves the copy to its broker."""
        completion.ack = partial(_ack_quietly, completion.ack)
        if completion.requeue is not None:
            completion.requeue = partial(_ack_quietly, completion.requeue)
        self._answered(completion, fence)

    def _stop_draining(self) -> None:
        drainer, self._drainer = self._drainer, None
        if drainer is not None:
            thread, stop = drainer
            stop.set()
            thread.join(timeout=5)

    def store_owed(self, wait_s: float) -> tuple[int, int]:
        """Store the completions still owed, synchronously, and ack each stored one; for a
        warm shutdown, when the event loop no longer retries them. Returns (stored, owed).

        While the store is unavailable it retries for up to ``wait_s`` seconds.
        What is still owed then goes back to its queue unacked, and its body may run again.
        The claims sent without an answer are released in the same time.
        """
        self._stop_draining()
        owed, deadline = len(self._owed), time.monotonic() + wait_s
        if not owed:
            self.outage.release_unconfirmed_until(deadline)
            return 0, 0
        logger.info("beetle: stopping: storing %d completion(s) owed", owed)
        pause = self.completion_retry_s
        while self._owed:
            self._store_owed_once()
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
        self.outage.release_unconfirmed_until(deadline)
        return stored, owed


def _ack_quietly(ack: Callable[[], None]) -> None:
    """``ack`` at a shutdown: a connection already gone leaves the stored copy to be
    dropped as a duplicate when it comes back."""
    try:
        ack()
    except Exception:
        logger.debug("beetle: cannot ack a completed message at shutdown", exc_info=True)
