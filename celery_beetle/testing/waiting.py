"""Polling for a condition with a deadline: what every fault test does while a system heals."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float = 30, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_while_progressing(
    predicate: Callable[[], bool],
    progress: Callable[[], int],
    stall: float = 30,
    timeout: float = 600,
    interval: float = 0.1,
) -> bool:
    """Poll ``predicate`` until it holds, for as long as ``progress`` (a count of work
    finished) keeps growing: give up once it has stood still for ``stall`` seconds, or
    after ``timeout`` in all. For a run whose length depends on the machine's load (a
    worker killed again and again), where only a run that stopped moving has failed."""
    deadline = time.monotonic() + timeout
    last, moved = progress(), time.monotonic()
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
        now, count = time.monotonic(), progress()
        if count != last:
            last, moved = count, now
        elif now - moved > stall:
            break
    return predicate()
