"""The beetle wire format: ``message_id`` and the ``x-beetle-*`` headers.

A redundant message carries the same ``message_id`` on every copy, so that the
worker side can deduplicate on ``(queue, message_id)``.  Non-redundant messages
only get a ``message_id`` where they have none: their publisher sees exactly
the headers it gave.
"""

from __future__ import annotations

import math
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

#: The longest a redundant message may live. A later ``x-beetle-expires-at`` (a timestamp in
#: ms, µs or ns by mistake) is refused at publish, and cut to this by the worker.
MAX_MESSAGE_LIFE_S = 366 * 86_400


class InvalidExpiry(ValueError):
    """A publisher-given ``x-beetle-expires-at`` that is not unix seconds within
    :data:`MAX_MESSAGE_LIFE_S`; raised before anything is written to a broker."""


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

    A publisher-given expiry is kept (:class:`InvalidExpiry` if it is not unix seconds within
    :data:`MAX_MESSAGE_LIFE_S`); otherwise the message lives ``ttl_s``.
    """
    headers = dict(properties.get("application_headers") or {})
    now_s = now()
    given = headers.get(EXPIRES_AT_HEADER)
    if given is not None:
        _check_expiry(given, now_s)
    flags = flags_of(headers) | FLAG_REDUNDANT
    if degraded:
        flags |= FLAG_DEGRADED
    headers[FORMAT_HEADER] = FORMAT_VERSION
    headers[FLAGS_HEADER] = flags
    headers.setdefault(EXPIRES_AT_HEADER, int(now_s + ttl_s))
    headers[PUBLISHED_AT_HEADER] = int(now_s * 1000)
    properties["application_headers"] = headers
    return headers


def _check_expiry(value: Any, now_s: float) -> None:
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds):
        raise InvalidExpiry(f"{EXPIRES_AT_HEADER}={value!r} is not a number of unix seconds")
    if seconds > now_s + MAX_MESSAGE_LIFE_S:
        raise InvalidExpiry(
            f"{EXPIRES_AT_HEADER}={value!r} is more than {MAX_MESSAGE_LIFE_S // 86_400} days "
            f"ahead: give unix seconds (not milliseconds), at most that far"
        )


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
