"""A copy Celery acked as the pool took it (``acks_late`` off), and the run could not claim.

Its claim failed (Redis away) or was deferred (another run holds the lease, or a retry is
not due), and a ``Reject`` after an early ack does nothing: the copy would be gone, and with
it the message when its twin went the same way. So the run publishes the message again,
with the same message id (the same record in the store), to its queue after a short delay;
the gate then parks, defers or drops the new copy as it does any other.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_beetle.store.state import MessageFacts
from celery_beetle.worker.errors import Deferred, HandBack
from celery_beetle.worker.retry_queue import RawMessage, publish_delayed

__all__ = ["send_back"]

logger = logging.getLogger(__name__)


def send_back(
    app: Any, raw: RawMessage, facts: MessageFacts, name: str, exc: HandBack | Deferred
) -> None:
    """Publish ``raw`` again to its queue, after the hand-back's delay (a deferral: 1 s).

    Raises ``exc`` when no broker takes it: only its twin on another broker is left then.
    """
    delay_ms = round(float(getattr(exc, "delay_s", 1.0)) * 1000)
    try:
        with app.producer_or_acquire() as producer:
            publish_delayed(producer, raw, facts.queue, delay_ms, facts.scope)
    except Exception as pub_exc:
        logger.error(
            "beetle: %s was acked as it was taken (acks_late off) and could not be claimed "
            "(%s), nor sent back (%r); only its twin on another broker is left",
            name,
            exc.reason,
            pub_exc,
        )
        raise exc from pub_exc
    logger.warning(
        "beetle: %s was acked as it was taken (acks_late off) and could not be claimed (%s); "
        "sent back to its queue in %.1f s",
        name,
        exc.reason,
        delay_ms / 1000,
    )
