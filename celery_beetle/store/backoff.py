"""Retry delays: exponential, capped, and the same in Python and in ``scripts/fail.lua``.

A failed message waits ``delay * 2**(n-1)`` after its n-th failure, never more than
``max_delay``. Doubling spaces retries out so that a dependency that is down is not hammered
(the "retry storm" of the seed documents); the cap keeps a message from waiting for days.
There is no jitter on purpose: the wait is stored as ``retry-not-before`` in Redis, and
every copy of the message and every worker read the same value.
"""

from __future__ import annotations

__all__ = ["backoff_ms"]


def backoff_ms(failures: int, delay_ms: int, max_delay_ms: int) -> int:
    """Milliseconds to wait after the ``failures``-th failure (1 for the first)."""
    if failures < 1 or delay_ms <= 0:
        return 0
    # The shift is bounded so a message that failed a thousand times does not build a
    # thousand-bit integer; fail.lua computes the same in floating point.
    return max(min(delay_ms << min(failures - 1, 62), max_delay_ms), 0)
