"""A copy Celery acked as the pool took it (``acks_late`` off), and the run could not claim.

Its claim failed (Redis away) or was deferred (another run holds the lease, or a retry is
not due), or its completion found no record (a Redis failover lost the claim, and nobody
took the run over). A ``Reject`` after an early ack does nothing: the copy would be gone,
and with it the message when its twin went the same way. So the run publishes the message
again, with the same message id (the same record in the store), to its queue after a
delay; the gate then parks, defers or drops the new copy as it does any other.

- One copy goes back for the one taken, as a requeue would return it: the message keeps
  as many copies as it had, however long Redis stays away.
- The delay doubles each time the same message is sent back (:data:`SENT_BACK_HEADER`
  counts them), from the hand-back's own (a deferral's: 1 s) up to :data:`MAX_DELAY_S`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from celery_beetle.store.state import MessageFacts
from celery_beetle.worker.errors import Deferred, HandBack
from celery_beetle.worker.retry_queue import RawMessage, publish_delayed
from kombu_beetle.envelope import FLAG_DEGRADED, FLAG_REDUNDANT, FLAGS_HEADER, flags_of

__all__ = ["MAX_DELAY_S", "SENT_BACK_HEADER", "send_back"]

logger = logging.getLogger(__name__)

#: how often the message was sent back so far (the delay doubles with each)
SENT_BACK_HEADER = "x-beetle-sent-back"
#: the longest wait of a copy sent back
MAX_DELAY_S = 60.0


def send_back(
    app: Any, raw: RawMessage, facts: MessageFacts, name: str, exc: HandBack | Deferred
) -> None:
    """Publish one copy of ``raw`` again to its queue, after a delay.

    Raises ``exc`` when no broker takes it: only its twin on another broker is left then.
    """
    times = _int(raw.headers.get(SENT_BACK_HEADER))
    delay_s = min(float(getattr(exc, "delay_s", 1.0)) * 2**times, MAX_DELAY_S)
    delay_ms = round(delay_s * 1000)
    flags = flags_of(raw.headers) & ~(FLAG_REDUNDANT | FLAG_DEGRADED)
    headers = {**raw.headers, FLAGS_HEADER: flags, SENT_BACK_HEADER: times + 1}
    try:
        with app.producer_or_acquire() as producer:
            publish_delayed(
                producer, replace(raw, headers=headers), facts.queue, delay_ms, facts.scope
            )
    except Exception as pub_exc:
        logger.error(
            "beetle: %s was acked as it was taken (acks_late off) and is not settled here "
            "(%s), nor sent back (%r); only its twin on another broker is left",
            name,
            exc.reason,
            pub_exc,
        )
        raise exc from pub_exc
    # a deferral is expected (a twin running elsewhere): said at DEBUG, as the gate does
    log = logger.warning if isinstance(exc, HandBack) else logger.debug
    log(
        "beetle: %s was acked as it was taken (acks_late off) and is not settled here (%s); "
        "sent back to its queue in %.1f s",
        name,
        exc.reason,
        delay_ms / 1000,
    )


def _int(value: Any) -> int:
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError):
        return 0
