"""The gate while the dedup store is unavailable: parked, probing, resuming by itself.

Nothing may run without a claim.
So when Redis stops answering, or stops taking writes, the gate **pauses**.
:func:`~celery_beetle.store.health.store_unavailable` tells such an error from a bug.
While paused, every delivery is parked unacked and unprocessed.
Parked deliveries do not widen the prefetch window, so the brokers stop sending once it is full.
A probe (a write: :class:`~celery_beetle.store.health.RedisProbe`) runs on a timer.
Once Redis takes it, the claims sent without an answer are released by their owner.
Then every parked delivery goes through the gate again.
The worker probes once as it starts too (:meth:`StoreOutage.pause_if_unreachable`).

An outage is said in two lines, at WARNING.
The first names the store (its password masked) and what the worker does meanwhile.
The second says how long it lasted and what waited for it.
What each delivery met meanwhile is logged at DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from celery_beetle.store import Store
from celery_beetle.store.health import store_unavailable
from celery_beetle.store.state import MessageFacts

__all__ = ["StoreOutage"]

logger = logging.getLogger(__name__)


class StoreOutage:
    """Pause, probe, release, resume.

    - ``store``: the dedup store (its ``release`` frees an unconfirmed claim).
    - ``probe()``: True once Redis takes a write again.
    - ``call_later(seconds, fn)``: a timer on the event loop.
    - ``resume()``: the gate sends its parked deliveries through again.
    - ``stats``: the gate's counts (the outage's end line reads some of them).
    """

    #: what the outage's end line counts, from ``stats``
    COUNTED = ("parked", "handed_back", "completion_retries")

    def __init__(
        self,
        *,
        store: Store,
        probe: Callable[[], bool],
        call_later: Callable[[float, Callable[[], None]], Any],
        resume: Callable[[], None],
        stats: Counter[str],
        store_name: str = "redis",
        probe_interval_s: float = 1.0,
    ) -> None:
        self.store = store
        self.probe = probe
        self.call_later = call_later
        self.resume = resume
        self.stats = stats
        self.store_name = store_name
        self.probe_interval_s = probe_interval_s
        self.paused = False
        self.paused_at = 0.0
        #: the seconds Redis was unavailable, in all (for the metrics)
        self.unavailable_s = 0.0
        #: claims sent without an answer, released by their owner once Redis answers
        self.to_release: list[tuple[MessageFacts, str]] = []
        self._counted_at_pause: dict[str, int] = {}

    def pause_if_unreachable(self) -> bool:
        """Probe the store once, as the worker starts, and pause now if it does not take the
        probe's write; True if paused."""
        if self.paused or self.probe():
            return False
        self.pause(getattr(self.probe, "last_error", None) or RuntimeError("the probe failed"))
        return True

    def pause(self, exc: BaseException) -> None:
        """Stop asking the store, say so once, and probe on a timer."""
        if self.paused:
            return
        self.paused = True
        self.paused_at = time.monotonic()
        self._counted_at_pause = {name: self.stats[name] for name in self.COUNTED}
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
        if not self.probe() or not self.release_unconfirmed_claims():
            self.call_later(self.probe_interval_s, self._probe_tick)
            return
        self.paused = False
        lasted = time.monotonic() - self.paused_at
        self.unavailable_s += lasted
        counted = self._counted_at_pause
        since = {name: self.stats[name] - counted.get(name, 0) for name in self.COUNTED}
        logger.warning(
            "beetle: dedup store %s answers again after %.1f s: %d deliveries parked, "
            "%d handed back, %d completion retries",
            self.store_name,
            lasted,
            since["parked"],
            since["handed_back"],
            since["completion_retries"],
        )
        self.resume()

    def release_later(self, facts: MessageFacts, owner: str) -> None:
        """Release a claim by its owner now, or once Redis answers again."""
        self.to_release.append((facts, owner))
        if not self.paused:
            self.release_unconfirmed_claims()

    def release_unconfirmed_until(self, deadline: float) -> None:
        """At a warm shutdown, when no probe will release them: release the claims sent
        without an answer, retrying until ``deadline`` (``time.monotonic()``), so that the
        next worker does not wait for their leases to end."""
        pause = 0.1
        while not self.release_unconfirmed_claims():
            if time.monotonic() + pause > deadline:
                logger.warning(
                    "beetle: stopping: %d claim(s) sent without an answer are left to their leases",
                    len(self.to_release),
                )
                return
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def release_unconfirmed_claims(self) -> bool:
        """Release the claims sent without an answer (their owner never ran the body); True
        once none is left.

        A release only spares the next copy the wait for the lease's end.
        So a release Redis refuses for a reason other than being unavailable is given up.
        """
        while self.to_release:
            facts, owner = self.to_release[0]
            try:
                self.store.release(facts, 0, owner)
            except Exception as exc:
                if store_unavailable(exc):
                    logger.debug("beetle: cannot release %s's claim yet: %r", owner, exc)
                    return False
                logger.warning(
                    "beetle: cannot release %s's claim (%r); its lease ends it", owner, exc
                )
            self.to_release.pop(0)
        return True
