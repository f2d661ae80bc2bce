"""Background reconnection of dead brokers.

Connecting can block for the whole connect timeout (a SIGSTOPped broker still
completes the TCP handshake, then never answers AMQP), so it happens on a
daemon thread.  The thread only builds connections and offers them to their
links; the main thread adopts them, so py-amqp objects are never shared while
in use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from .brokers import LINK_ERRORS, BrokerLink

logger = logging.getLogger(__name__)


class Reviver:
    """Reconnects dead links with backoff until it is stopped."""

    #: longest sleep between two looks at the links, seconds
    idle_wait_s = 0.5

    def __init__(
        self,
        links: Sequence[BrokerLink],
        on_offer: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._links = links
        self._on_offer = on_offer
        self._clock = clock
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Start the thread if needed and make it look at the links now."""
        if self._stopped.is_set():
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="beetle-reviver", daemon=True)
            self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            now = self._clock()
            for link in self._links:
                if self._stopped.is_set():
                    return
                if link.due(now):
                    self._try(link)
            waits = [
                link.next_retry_at - self._clock()
                for link in self._links
                if link.conn is None and link.pending is None
            ]
            if not waits:
                # every link is up or waiting to be adopted: sleep until woken
                self._wake.wait(self.idle_wait_s * 10)
                continue
            self._wake.wait(max(0.01, min(min(waits), self.idle_wait_s)))

    def _try(self, link: BrokerLink) -> None:
        try:
            conn = link.connect()
        except Exception as exc:
            # the thread must outlive any error, so nothing propagates; but an error that is
            # not a broker's (a bug, a bad option) is logged loudly, not taken for downtime
            link.last_error = exc
            link._schedule_retry()
            if isinstance(exc, LINK_ERRORS):
                logger.debug("beetle: broker %s still down: %r", link.name, exc)
            else:
                logger.error("beetle: reconnecting %s failed: %r", link.name, exc, exc_info=exc)
            return
        if self._stopped.is_set():
            conn.collect()
            return
        link.offer(conn)
        if self._on_offer is not None:
            self._on_offer()
