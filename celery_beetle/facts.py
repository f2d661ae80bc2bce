"""What the gate and the pool agree on about a delivery: its dedup identity and expiry.

The gate works these facts out once, in the main process, and writes them into the
delivery's headers under :data:`FACTS_HEADER` (Celery copies message headers into
``task.request``), so the claim in the pool uses the same queue, ``message_id`` and expiry.
"""

from __future__ import annotations

from typing import Any

from celery_beetle.state import MessageFacts
from kombu_beetle.envelope import EXPIRES_AT_HEADER, PUBLISHED_AT_HEADER

__all__ = ["COMPLETED_MARK", "FACTS_HEADER", "facts_from_headers", "message_facts"]

#: Header the gate adds to a delivery for the pool: ``{"queue", "message_id", "expires_at_ms"}``.
#: It is stripped again before a message is republished (retry, dead letter).
FACTS_HEADER = "beetle_facts"
#: Set in that header by :class:`~celery_beetle.bootstep.BeetleRequest` when the run
#: completed, so the gate can drop the other copy without asking Redis.
COMPLETED_MARK = "completed"


def message_facts(
    queue: str,
    message_id: str,
    headers: dict[str, Any] | None,
    default_ttl_ms: int,
    now_ms: int,
) -> MessageFacts:
    """The dedup identity and expiry of a delivery.

    The expiry is ``x-beetle-expires-at`` (unix seconds) when the transport stamped one;
    otherwise (a non-redundant BeetleTask) the publish time, or now, plus the default TTL.
    """
    headers = headers or {}
    expires_at_ms = _ms(headers.get(EXPIRES_AT_HEADER), 1000)
    if expires_at_ms is None:
        published_ms = _ms(headers.get(PUBLISHED_AT_HEADER), 1) or now_ms
        expires_at_ms = published_ms + default_ttl_ms
    return MessageFacts(queue=queue, message_id=message_id, expires_at_ms=expires_at_ms)


def facts_from_headers(value: Any) -> MessageFacts | None:
    """Read back what the gate wrote under :data:`FACTS_HEADER`; None if absent or garbled."""
    if not isinstance(value, dict):
        return None
    try:
        return MessageFacts(
            queue=str(value["queue"]),
            message_id=str(value["message_id"]),
            expires_at_ms=int(value["expires_at_ms"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _ms(value: Any, scale: int) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value) * scale)
    except (TypeError, ValueError):
        return None
