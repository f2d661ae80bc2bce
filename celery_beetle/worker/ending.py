"""How a run the gate started ends: finished, or handed back by the pool.

==============  ========================================================================
ending          what the gate does
==============  ========================================================================
finished        its reservation needs no more renewals; the copies that waited for it
                are acked if it completed, or sent through the gate again
handed back     the pool could not take it (:class:`~.errors.HandBack`): it is requeued
                after a backoff, the gate pauses if the store was unavailable, and a
                claim sent without an answer is released once Redis answers
==============  ========================================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from celery_beetle.worker.deliveries import Delivery
from celery_beetle.worker.facts import COMPLETED_MARK, FACTS_HEADER
from celery_beetle.worker.gate_claims import ClaimKeeper
from celery_beetle.worker.handback import HandBacks
from celery_beetle.worker.held import Holding
from celery_beetle.worker.outage import StoreOutage
from celery_beetle.worker.verdict import Verdict

__all__ = ["Endings", "RunEnding"]


class RunEnding:
    """What a delivery the gate started is given to say how its run ended: once.

    An object, not a closure that names itself: such a closure is a reference cycle, and
    the cyclic garbage collector's full collections would pause the main process.
    """

    __slots__ = ("delivery", "ended", "endings")

    def __init__(self, endings: Endings, delivery: Delivery) -> None:
        self.endings = endings
        self.delivery = delivery
        self.ended = False

    def finished(self) -> None:
        """Its ack or reject happened."""
        if not self.ended:
            self.ended = True
            self.endings.finished(self.delivery)

    def handed_back(self, mark: dict[str, Any], reject: Callable[[], Any]) -> None:
        """The pool handed it back; ``reject()`` requeues it, after a backoff."""
        if not self.ended:
            self.endings.handed_back(self, mark, reject)

    def requeue(self, reject: Callable[[], Any]) -> None:
        """The hand-back's backoff is over: requeue the copy, and the run has ended."""
        try:
            reject()
        finally:
            self.finished()


class Endings:
    """The ends of the runs a :class:`~.gate.DeliveryGate` started.

    - ``holding``: the holding table (the copies that waited for a run).
    - ``claim_keeper``: the reservations renewed until a run ends.
    - ``outage``: the store's outage (a hand-back may pause, and release a claim).
    - ``handbacks``: the backoff of each message's hand-backs.
    - ``stats``, ``call_later``: the gate's counts and timer.
    """

    def __init__(
        self,
        *,
        holding: Holding,
        claim_keeper: ClaimKeeper,
        outage: StoreOutage,
        handbacks: HandBacks,
        stats: Counter[str],
        call_later: Callable[[float, Callable[[], None]], Any],
    ) -> None:
        self.holding = holding
        self.claim_keeper = claim_keeper
        self.outage = outage
        self.handbacks = handbacks
        self.stats = stats
        self.call_later = call_later

    def finished(self, d: Delivery) -> None:
        """The run of ``d`` was acked or rejected (its consumer still the same)."""
        if d.generation != self.holding.generation:
            return
        self.claim_keeper.unreserve(d.key)
        header = (d.message.headers or {}).get(FACTS_HEADER)
        completed = isinstance(header, dict) and bool(header.get(COMPLETED_MARK))
        self.holding.run_ended(d.key, completed)

    def handed_back(
        self, ending: RunEnding, mark: dict[str, Any], reject: Callable[[], Any]
    ) -> None:
        """The pool could not take the delivery: requeue it after a backoff, not at once."""
        d = ending.delivery
        if mark.get("store"):
            self.outage.pause(RuntimeError(str(mark.get("reason") or "the pool's claim failed")))
        owner = mark.get("owner")
        if owner:  # while paused, the probe releases it before the gate resumes
            self.outage.release_later(d.facts, str(owner))
        delay = max(float(mark.get("delay_s") or 0), self.handbacks.delay_for(d.key, d.message))
        self.stats[Verdict.HANDED_BACK] += 1
        self.call_later(delay, partial(ending.requeue, reject))
