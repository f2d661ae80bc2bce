"""The gate while the dedup store is unavailable: parked, probing, resuming by itself.

Nothing may run without a claim, so when Redis stops answering, or stops taking writes
(:func:`~celery_beetle.store.health.store_unavailable` tells that from a bug), the gate
**pauses** (:meth:`~StoreOutage._pause`): every delivery is parked unacked and unprocessed,
and parked deliveries do not widen the prefetch window, so the brokers stop sending once it
is full; that is how the worker "stops taking messages". A probe (a write:
:class:`~celery_beetle.store.health.RedisProbe`) runs on a timer; once Redis takes it, the
claims sent without an answer are released by their owner (their body never ran:
:meth:`~StoreOutage._release_unconfirmed_claims`), and every parked delivery goes through the
gate again. The worker probes once as it starts too (:meth:`~StoreOutage.pause_if_unreachable`),
so a store that is away then is said at once, not at the first delivery.

An outage is said in two lines, at WARNING: as it begins, naming the store (its password
masked) and what the worker does meanwhile, and as it ends, with how long it lasted and what
waited for it. What each delivery met meanwhile is logged at DEBUG.

:class:`StoreOutage` is part of the gate (:class:`~celery_beetle.worker.gate.DeliveryGate`),
apart only so each module reads on its own (as :mod:`.bad_input`); what it uses of the gate is
named at its top.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery_beetle.store import Store
from celery_beetle.store.health import store_unavailable
from celery_beetle.store.state import MessageFacts

if TYPE_CHECKING:
    from celery_beetle.worker.held import Delivery

__all__ = ["StoreOutage"]

logger = logging.getLogger(__name__)


class StoreOutage:
    """Pause, probe, release, resume: for :class:`~celery_beetle.worker.gate.DeliveryGate`."""

    # provided by the gate
    store: Store
    store_name: str
    probe: Callable[[], bool]
    probe_interval_s: float
    call_later: Callable[[float, Callable[[], None]], Any]
    stats: Counter[str]
    generation: int
    paused: bool
    paused_at: float
    unavailable_s: float
    _parked: list[Delivery]
    _to_release: list[tuple[MessageFacts, str]]
    _counted_at_pause: dict[str, int]

    if TYPE_CHECKING:

        def _examine(self, d: Delivery) -> str: ...

    #: what the outage's end line counts, from :attr:`stats`
    _COUNTED = ("parked", "handed_back", "completion_retries")

    def pause_if_unreachable(self) -> bool:
        """Probe the store once (as the worker starts) and pause now if it does not take the
        probe's write; True if paused."""
        if self.paused or self.probe():
            return False
        self._pause(getattr(self.probe, "last_error", None) or RuntimeError("the probe failed"))
        return True

    def _pause(self, exc: BaseException) -> None:
        if self.paused:
            return
        self.paused = True
        self.paused_at = time.monotonic()
        self._counted_at_pause = {name: self.stats[name] for name in self._COUNTED}
        self.stats["pauses"] += 1
        logger.warning(
            "beetle: dedup store %s is unreachable (%r): parking deliveries, unacked and not "
            "run, until it answers (no task runs without a claim)",
            self.store_name,
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
        lasted = time.monotonic() - self.paused_at
        self.unavailable_s += lasted
        parked, self._parked = self._parked, []
        counted = self._counted_at_pause
        since = {name: self.stats[name] - counted.get(name, 0) for name in self._COUNTED}
        logger.warning(
            "beetle: dedup store %s answers again after %.1f s: %d deliveries parked, "
            "%d handed back, %d completion retries",
            self.store_name,
            lasted,
            since["parked"],
            since["handed_back"],
            since["completion_retries"],
        )
        for d in parked:
            if d.generation == self.generation:
                self._examine(d)

    def _release_later(self, facts: MessageFacts, owner: str) -> None:
        """Release a claim by its owner now, or once Redis answers again."""
        self._to_release.append((facts, owner))
        if not self.paused:
            self._release_unconfirmed_claims()

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
