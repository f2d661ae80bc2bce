"""What this process has said about each broker: a loss and a return logged once each.

A worker holds two connections per broker (the consumer's and the producer's), and a
process may hold more; each notices a broker's loss on its own, often much later (an idle
producer, on its next publish). The operator wants one line when a broker goes and one
when it comes back, so the lines are said here, per broker, whatever connection saw them.

Each loss is an *outage*, numbered per broker. A connection remembers the outage count as
it was made (:meth:`BrokerLog.up`): one made before the last outage that notices its loss
only now is late news of that outage (logged at DEBUG), not a new one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["BROKER_LOG", "BrokerLog"]

logger = logging.getLogger("kombu_beetle.brokers")


class BrokerLog:
    """``down(name, exc, made_at)`` and ``up(name)``, each said once per outage."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        #: broker name -> when this process said it went down
        self._down_since: dict[str, float] = {}
        #: broker name -> outages said so far
        self._outages: Counter[str] = Counter()

    def down(self, name: str, exc: BaseException | None, made_at: int | None = None) -> bool:
        """Say that broker ``name`` is down, unless said already for this outage; ``made_at``
        is the outage count as the failing connection was made (None: no connection was).
        True if said now."""
        with self._lock:
            late = made_at is not None and made_at < self._outages[name]
            if name in self._down_since or late:
                said = False
            else:
                self._down_since[name] = self._clock()
                self._outages[name] += 1
                said = True
        if said:
            logger.warning("beetle: broker %s is down: %r", name, exc)
        else:
            logger.debug("beetle: another connection to broker %s is down: %r", name, exc)
        return said

    def up(self, name: str) -> int:
        """Say that broker ``name`` answers again, if it was said to be down; returns the
        outage count, for the connection made now to remember."""
        with self._lock:
            since = self._down_since.pop(name, None)
            outages = self._outages[name]
        if since is not None:
            logger.warning(
                "beetle: broker %s is up again after %.1f s", name, self._clock() - since
            )
        return outages


#: this process's record
BROKER_LOG = BrokerLog()
