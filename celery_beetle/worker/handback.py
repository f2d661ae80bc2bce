"""Handing a delivery back: requeued after a backoff, never acked, never dropped.

A delivery the worker cannot take now (its dead letter cannot be published, the pool could
not claim it, its task is unknown here, an error nobody foresaw) goes back to its broker, but
not at once: at once, one poison message or one unhealthy store would spin between broker and
worker as fast as both can go. It waits 0.5 s, doubling per hand-back of the same message up
to a cap, holding its prefetch slot meanwhile, so a worker with nothing but trouble takes
nothing new.

On a quorum queue every requeue counts against the queue's ``delivery-limit`` (20 by default
from RabbitMQ 4.0). So hand-backs *count* the broker's own ``x-delivery-count`` header too:
the backoff of a delivery is ``0.5 s * 2**n`` for the larger of this worker's count and the
broker's, capped at ``quorum_max_s`` (5 min) rather than ``max_s``, and a worker restart
(which forgets its own counts) does not restart the backoff. A delivery counted often is
replaced by a fresh copy before the gate sees it (:mod:`.renewal`), so the limit is never
reached by hand-backs. Deferred copies and retries do not requeue (a deferred copy stays
unacked; a retry is a new publish to a delay queue), so they never count.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from celery_beetle.worker.verdict import Verdict
from kombu_beetle.renewal import DELIVERY_COUNT_HEADER, delivery_count

__all__ = ["DELIVERY_COUNT_HEADER", "HandBacks", "ack", "channel_open", "delivery_count", "requeue"]

logger = logging.getLogger(__name__)


class HandBacks:
    """``requeue_later(message, key)``: requeue after the backoff ``key`` has earned.

    ``key`` names the message (``(queue, message_id)``), so the backoff grows per message;
    None waits one second. The last ``memory`` keys are remembered.
    """

    def __init__(
        self,
        call_later: Callable[[float, Callable[[], None]], Any],
        max_s: float = 30.0,
        memory: int = 10_000,
        quorum_max_s: float = 300.0,
        stats: Counter[str] | None = None,
    ) -> None:
        self.call_later = call_later
        #: ``handed_back`` counts the hand-backs of :meth:`hand_back`
        self.stats: Counter[str] = Counter() if stats is None else stats
        self.max_s = max_s
        self.quorum_max_s = quorum_max_s
        self.memory = memory
        self._counts: OrderedDict[Any, int] = OrderedDict()

    def delay_for(self, key: Any, message: Any = None) -> float:
        """Seconds before handing ``key`` back: 0.5, doubling per hand-back, capped; for a
        quorum queue's delivery, counted from its ``x-delivery-count`` as well."""
        delivered = delivery_count(message)
        if key is None and delivered is None:
            return 1.0
        count = 0
        if key is not None:
            count = self._counts.pop(key, 0)
            self._counts[key] = count + 1
            while len(self._counts) > self.memory:
                self._counts.popitem(last=False)
        if delivered is None:
            return float(min(0.5 * 2 ** min(count, 16), self.max_s))
        count = max(count, delivered)
        return float(min(0.5 * 2 ** min(count, 16), max(self.max_s, self.quorum_max_s)))

    def hand_back(self, message: Any, key: Any, delay_s: float | None = None) -> Verdict:
        """Count a hand-back and requeue ``message`` after its backoff."""
        self.stats[Verdict.HANDED_BACK] += 1
        self.requeue_later(message, key, delay_s)
        return Verdict.HANDED_BACK

    def requeue_later(self, message: Any, key: Any, delay_s: float | None = None) -> None:
        """Requeue ``message`` after ``delay_s``, or the backoff of ``key``."""
        delay = self.delay_for(key, message) if delay_s is None else max(delay_s, 0.1)
        self.call_later(delay, lambda: requeue(message))


def ack(message: Any) -> None:
    try:
        message.ack()
    except Exception as exc:  # a dead broker's ack is lost; that broker redelivers
        logger.debug("beetle: ack failed: %r", exc)


def requeue(message: Any) -> None:
    """Give ``message`` back to its broker; a dead broker's reject is lost, and that broker
    delivers the message again anyway."""
    if not channel_open(message):
        return
    try:
        message.reject(requeue=True)
    except Exception as exc:
        logger.debug("beetle: requeue failed: %r", exc)


def channel_open(message: Any) -> bool:
    channel = getattr(message, "channel", None)
    if channel is None:
        return True
    return bool(getattr(channel, "is_open", True)) and getattr(channel, "connection", 1) is not None
