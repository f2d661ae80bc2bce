"""The beetle wire format: ``message_id`` and the ``x-beetle-*`` headers.

A redundant message carries the same ``message_id`` on every copy, so that the
worker side can deduplicate on ``(queue, message_id)``.  Non-redundant messages
only get a ``message_id`` where they have none: their publisher sees exactly
the headers it gave.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

FORMAT_HEADER = "x-beetle-format"
FLAGS_HEADER = "x-beetle-flags"
EXPIRES_AT_HEADER = "x-beetle-expires-at"
PUBLISHED_AT_HEADER = "x-beetle-published-at"

#: set by the worker side on a message it moves on (to a delay or dead-letter queue): a
#: continuation of a traced message, not a new publish, so the transport does not trace it
REPUBLISHED_HEADER = "x-beetle-republished"

FORMAT_VERSION = 1
#: bit 1: the message is published to two brokers and must be deduplicated
FLAG_REDUNDANT = 1
#: bit 2: fewer brokers than the redundancy were alive, so it went out once
FLAG_DEGRADED = 2


def flags_of(headers: Mapping[str, Any] | None) -> int:
    if not headers:
        return 0
    try:
        return int(headers.get(FLAGS_HEADER) or 0)
    except (TypeError, ValueError):
        return 0


def is_redundant(
    headers: Mapping[str, Any] | None, routing_key: str, redundant_queues: frozenset[str]
) -> bool:
    """A message is redundant when its publisher flagged it, or its queue is marked so."""
    return bool(flags_of(headers) & FLAG_REDUNDANT) or routing_key in redundant_queues


def ensure_message_id(properties: dict[str, Any], new_id: Callable[[], str] | None = None) -> str:
    message_id = properties.get("message_id")
    if not message_id:
        message_id = (new_id or _uuid)()
        properties["message_id"] = message_id
    return str(message_id)


def stamp_redundant(
    properties: dict[str, Any],
    ttl_s: float,
    degraded: bool,
    now: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Add the ``x-beetle-*`` headers to a redundant message's properties (in place).

    A publisher-given expiry is kept; otherwise the message lives ``ttl_s``.
    """
    headers = dict(properties.get("application_headers") or {})
    now_s = now()
    flags = flags_of(headers) | FLAG_REDUNDANT
    if degraded:
        flags |= FLAG_DEGRADED
    headers[FORMAT_HEADER] = FORMAT_VERSION
    headers[FLAGS_HEADER] = flags
    headers.setdefault(EXPIRES_AT_HEADER, int(now_s + ttl_s))
    headers[PUBLISHED_AT_HEADER] = int(now_s * 1000)
    properties["application_headers"] = headers
    return headers


def is_expired(headers: Mapping[str, Any] | None, now_s: float) -> bool:
    if not headers:
        return False
    expires_at = headers.get(EXPIRES_AT_HEADER)
    try:
        return expires_at is not None and float(expires_at) <= now_s
    except (TypeError, ValueError):
        return False


def _uuid() -> str:
    return str(uuid.uuid4())
