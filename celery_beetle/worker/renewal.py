"""Renewal: a BeetleTask delivery that a quorum queue counted often is replaced by a fresh copy.

A quorum queue counts every delivery of a message (``x-delivery-count``): a hand-back, a
worker restart, a consumer timeout that closed the channel. Past the queue's
``delivery-limit`` (20 by default from RabbitMQ 4.0) the broker drops the message, or
dead-letters it for a reason that is not the task's. So before the gate looks at a delivery
whose count has reached ``beetle_delivery_renewal`` (10), the worker publishes a copy of it,
unchanged, to the same queue on the same broker, and acks the delivery once the broker has
confirmed the copy. The copy's count starts from nothing.

The copy and the delivery are one message to the dedup store (the same ``message_id`` and
queue), so a crash between the confirm and the ack costs one duplicate read, never a second
run. A copy that cannot be published leaves the delivery as it is: the gate takes it, and the
next delivery tries again. ``attempts`` still bounds the runs of a body, whatever the renewals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery_beetle.worker.facts import FACTS_HEADER
from kombu_beetle.renewal import DELIVERY_COUNT_HEADER, delivery_count

__all__ = ["DeliveryRenewal"]

logger = logging.getLogger(__name__)

#: ``publish_again(message, queue, headers)``: returns once the copy is confirmed, or raises
PublishAgain = Callable[[Any, str, dict[str, Any]], None]


class DeliveryRenewal:
    """``renewed(message, queue)``: True when ``message`` was replaced by a fresh copy (and
    acked); False when the gate should take it as it is."""

    def __init__(self, at_count: int, publish_again: PublishAgain) -> None:
        self.at_count = at_count
        self.publish_again = publish_again
        #: deliveries replaced, and copies that could not be published
        self.renewed_count = 0
        self.failed_count = 0

    def renewed(self, message: Any, queue: str) -> bool:
        count = delivery_count(message)
        if not self.at_count or count is None or count < self.at_count:
            return False
        headers = {
            k: v
            for k, v in (message.headers or {}).items()
            if k not in (DELIVERY_COUNT_HEADER, FACTS_HEADER)
        }
        try:
            self.publish_again(message, queue, headers)
        except Exception as exc:
            self.failed_count += 1
            logger.warning(
                "beetle: could not renew a delivery of %s counted %d times (%r); "
                "the gate takes it as it is",
                queue,
                count,
                exc,
            )
            return False
        message.ack()
        self.renewed_count += 1
        logger.info(
            "beetle: renewed a delivery of %s (message %s) its broker had counted %d times",
            queue,
            (message.properties or {}).get("message_id"),
            count,
        )
        return True
