"""What the gate and the pool agree on about a delivery: its dedup identity and expiry.

The gate works these facts out once, in the main process, and writes them into the
delivery's headers under :data:`FACTS_HEADER` (Celery copies message headers into
``task.request``), so the claim in the pool uses the same queue, scope, ``message_id`` and
expiry.

The identity is ``(scope, message_id)``. The scope is the logical queue
(:mod:`kombu_beetle.scopes`): the consumed queue's name, or what ``beetle_dedup_scopes``
maps it to. The physical queue stays in the facts too, because a retry and a dead letter go
back to (and are named after) the queue the message was consumed from.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from celery_beetle.store.state import MessageFacts
from kombu_beetle.envelope import (
    EXPIRES_AT_HEADER,
    FLAGS_HEADER,
    MAX_MESSAGE_LIFE_S,
    PUBLISHED_AT_HEADER,
)

__all__ = [
    "CLAIM_MARK",
    "COMPLETED_MARK",
    "FACTS_HEADER",
    "HANDBACK_MARK",
    "MAX_MESSAGE_ID_LENGTH",
    "MAX_MESSAGE_LIFE_MS",
    "RUNTIME_MARK",
    "GateClaim",
    "InvalidHeader",
    "facts_from_headers",
    "facts_header",
    "message_facts",
]

logger = logging.getLogger(__name__)

#: A ``message_id`` longer than this is refused as bad input (it becomes part of a key).
MAX_MESSAGE_ID_LENGTH = 1024
#: The longest a message may live: a later ``x-beetle-expires-at`` (a timestamp in µs or
#: ns by mistake) is cut to this, so that every record keeps a TTL Redis can hold.
MAX_MESSAGE_LIFE_MS = MAX_MESSAGE_LIFE_S * 1000

#: Header the gate adds to a delivery for the pool:
#: ``{"queue", "scope", "message_id", "expires_at_ms"}`` (no ``scope``: the queue's name).
#: It is stripped again before a message is republished (retry, dead letter).
FACTS_HEADER = "beetle_facts"
#: Set in that header by :class:`~celery_beetle.task.BeetleRequest` when the run
#: completed, so the gate can drop the other copy without asking Redis.
COMPLETED_MARK = "completed"
#: Set there by the request when the pool handed the delivery back (``{"delay_s", "store"}``),
#: so the gate requeues it after a backoff instead of at once.
HANDBACK_MARK = "handback"
#: Set there by the gate when it claimed the message for this delivery (see
#: :class:`GateClaim`): the pool runs on that claim instead of claiming again, and the gate
#: stores the completion before it acks.
CLAIM_MARK = "claim"
#: Set there by the request on success: the body's runtime and the pool process that ran it,
#: for the ``completed`` event the gate writes (the audit pairs it with that process's
#: ``started``).
RUNTIME_MARK = "runtime_ms"
PID_MARK = "pid"


@dataclass(frozen=True)
class GateClaim:
    """What the gate's claim gave the delivery: a lease (``token``, ``attempt``,
    ``deadline_ms``) held by ``owner``, or, with ``dead_letter`` set (the give-up reason),
    a dead letter this delivery is to publish (``attempt``, ``exceptions`` for its headers).
    ``started``: the claim counted the attempt and set the whole lease, for a pool process
    that was free, so the body begins without a start; ``sent_at`` (monotonic seconds) is
    when the claim was sent, which the body's time limits count from.
    """

    owner: str
    token: int = 0
    attempt: int = 0
    deadline_ms: int = 0
    dead_letter: str = ""
    exceptions: int = 0
    started: bool = False
    sent_at: float = 0.0

    def mark(self) -> dict[str, Any]:
        """The fields that are set, for the delivery's headers (the pool reads them back)."""
        fields = (
            ("owner", self.owner),
            ("token", self.token),
            ("attempt", self.attempt),
            ("deadline_ms", self.deadline_ms),
            ("dead_letter", self.dead_letter),
            ("exceptions", self.exceptions),
            ("started", self.started),
            ("sent_at", self.sent_at),
        )
        return {name: value for name, value in fields if value}

    @classmethod
    def from_mark(cls, value: Any) -> GateClaim | None:
        """Read back :meth:`mark`; None if absent or garbled (the pool then claims itself)."""
        if not isinstance(value, dict) or not value.get("owner"):
            return None
        try:
            return cls(
                owner=str(value["owner"]),
                token=int(value.get("token") or 0),
                attempt=int(value.get("attempt") or 0),
                deadline_ms=int(value.get("deadline_ms") or 0),
                dead_letter=str(value.get("dead_letter") or ""),
                exceptions=int(value.get("exceptions") or 0),
                started=value.get("started") is True,
                sent_at=float(value.get("sent_at") or 0.0),
            )
        except (TypeError, ValueError, OverflowError):
            return None


class InvalidHeader(ValueError):
    """A header the client controls holds what no publisher of this project writes; the
    delivery is dead-lettered with reason ``invalid_header``, never raised out of the gate."""

    def __init__(self, name: str, value: Any, why: str) -> None:
        self.name = name
        shown = repr(value)
        if len(shown) > 80:
            shown = f"{shown[:60]}... ({len(shown)} characters)"
        super().__init__(f"{name}={shown}: {why}")


def message_facts(
    queue: str,
    message_id: str,
    headers: dict[str, Any] | None,
    default_ttl_ms: int,
    now_ms: int,
    scope: str | None = None,
) -> MessageFacts:
    """The dedup identity and expiry of a delivery from ``queue``, deduplicated under
    ``scope`` (None: the queue's name); :class:`InvalidHeader` if a header holds what no
    publisher of this project writes.

    The expiry is ``x-beetle-expires-at`` (unix seconds) when the transport stamped one;
    otherwise (a non-redundant BeetleTask) the publish time, or now, plus the default TTL.
    It is never later than :data:`MAX_MESSAGE_LIFE_MS` from now.
    """
    if not isinstance(message_id, str) or not message_id:
        raise InvalidHeader("message_id", message_id, "must be a non-empty string")
    if len(message_id) > MAX_MESSAGE_ID_LENGTH:
        raise InvalidHeader(
            "message_id", message_id, f"longer than {MAX_MESSAGE_ID_LENGTH} characters"
        )
    headers = headers or {}
    flags = headers.get(FLAGS_HEADER)
    if flags is not None and not (_is_integer(flags) and 0 <= int(flags) < 2**16):
        raise InvalidHeader(FLAGS_HEADER, flags, "must be a small non-negative integer")
    expires_at = _number(headers, EXPIRES_AT_HEADER)
    if expires_at is not None:
        expires_at_ms = int(expires_at * 1000)
    else:
        published_at = _number(headers, PUBLISHED_AT_HEADER)
        published_ms = int(published_at) if published_at else now_ms
        expires_at_ms = published_ms + default_ttl_ms
    latest = now_ms + MAX_MESSAGE_LIFE_MS
    if expires_at_ms > latest:
        logger.warning(
            "beetle: message %s on %r expires %s, more than %d days ahead; cut to that",
            message_id[:100],
            queue,
            headers.get(EXPIRES_AT_HEADER) or headers.get(PUBLISHED_AT_HEADER),
            MAX_MESSAGE_LIFE_MS // 86_400_000,
        )
        expires_at_ms = latest
    return MessageFacts(
        queue=queue, message_id=message_id, expires_at_ms=expires_at_ms, scope=scope or queue
    )


def facts_header(facts: MessageFacts) -> dict[str, Any]:
    """What the gate writes under :data:`FACTS_HEADER` for the pool."""
    return {
        "queue": facts.queue,
        "scope": facts.scope,
        "message_id": facts.message_id,
        "expires_at_ms": facts.expires_at_ms,
    }


def facts_from_headers(value: Any) -> MessageFacts | None:
    """Read back what the gate wrote under :data:`FACTS_HEADER`; None if absent or garbled."""
    if not isinstance(value, dict):
        return None
    try:
        return MessageFacts(
            queue=str(value["queue"]),
            message_id=str(value["message_id"]),
            expires_at_ms=int(value["expires_at_ms"]),
            scope=str(value.get("scope") or ""),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def _number(headers: dict[str, Any], name: str) -> float | None:
    """A header that must hold a finite number (int, float, decimal or numeric string)."""
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidHeader(name, value, "must be a number, not a boolean")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidHeader(name, value, "must be a number") from None
    if not math.isfinite(number):
        raise InvalidHeader(name, value, "must be a finite number")
    return number


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and value.isdigit() and len(value) < 10
