"""Time-ordered message ids for outbox rows (UUIDv7 layout, RFC 9562).

The row's id is the task id and the message id the dedup store keys on, so it must be unique
across processes and hosts (74 random bits per millisecond), and ordered by creation so
the table's primary key index grows at its right edge instead of splitting pages at random
as UUIDv4 does. Within one process, ids made in the same millisecond still sort in order:
the 12 bits after the timestamp count up (RFC 9562's "method 1").

It prints as a plain UUID (hex and ``-``), so its dedup key is the short form A of
:mod:`celery_beetle.store.keys` and every Celery tool accepts it as a task id.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

__all__ = ["id_time_ms", "new_id"]

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def new_id(clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> str:
    """A new UUIDv7 as text: 48 bits of unix ms, a 12-bit in-process sequence, 62 random bits."""
    global _last_ms, _seq
    with _lock:
        ms = clock_ms()
        if ms <= _last_ms:
            # same millisecond (or the clock stepped back): keep the order with the sequence
            _seq += 1
            if _seq > 0xFFF:
                _last_ms += 1
                _seq = 0
            ms = _last_ms
        else:
            _last_ms, _seq = ms, int.from_bytes(os.urandom(2), "big") & 0x3FF
        seq = _seq
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    return str(uuid.UUID(int=value))


def id_time_ms(message_id: str) -> int | None:
    """The creation time of an id made by :func:`new_id` (unix ms); None for another kind."""
    try:
        value = uuid.UUID(message_id)
    except (ValueError, TypeError, AttributeError):
        return None
    if value.version != 7:
        return None
    return value.int >> 80
