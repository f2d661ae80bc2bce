"""Faults of a Redis that still answers: it refuses writes, or forgets its scripts.

Unlike a kill or a SIGSTOP, these leave the connection healthy, so the client sees an error
reply (``OOM command not allowed``, ``NOSCRIPT``) rather than a dead socket: the case where
a store error is easiest to mistake for a task's own failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def refusing_writes(server: Any) -> Iterator[None]:
    """Every write fails with OOM while inside (``maxmemory 1``, ``noeviction``); reads
    still answer. The limit is lifted on the way out, even if the body failed."""
    with server.client() as r:
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", 1)
    try:
        yield
    finally:
        with server.client() as r:
            r.config_set("maxmemory", 0)
