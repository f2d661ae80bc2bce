"""Is the dedup store reachable? The errors that mean "no", and a cheap probe.

Nothing may run without a claim, so when Redis stops answering the worker must stop taking
messages and start again by itself once Redis is back (a restart, a Sentinel failover, a
Cluster resharding). Both halves of the worker need to tell "Redis is unreachable" apart from
a bug: :data:`STORE_ERRORS` is that list. The gate then probes with :class:`RedisProbe`, a
separate client with short timeouts, so that while Redis hangs (SIGSTOP, a partition) the
worker's event loop blocks for a fraction of a second per probe, not for the store's
five-second socket timeout.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from billiard.exceptions import SoftTimeLimitExceeded
from redis import exceptions as redis_errors

from celery_beetle.store import connect

__all__ = ["STORE_ERRORS", "RedisProbe", "call_until_stored"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Errors that mean the store cannot be reached (or cannot take writes) right now; anything
#: else from redis-py is a bug and is raised. ReadOnlyError: a replica after a failover, until
#: the client finds the new master. ClusterDownError/TryAgainError: a cluster mid-failover.
STORE_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    OSError,
)


class RedisProbe:
    """Answers "does Redis answer?" within ``timeout_s``, never raising."""

    def __init__(self, url: str, timeout_s: float = 0.5) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._client: Any = None

    def __call__(self) -> bool:
        try:
            if self._client is None:
                self._client = connect(
                    self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
                )
            return bool(self._client.ping())
        except Exception as exc:  # any failure means "not yet"; the gate tries again
            logger.debug("beetle: Redis probe failed: %r", exc)
            self._reset()
            return False

    def _reset(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass

    def close(self) -> None:
        self._reset()


def call_until_stored(
    operation: Callable[[int], T],
    what: str,
    *,
    max_wait_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``operation(try_number)`` until Redis takes it, sleeping between tries.

    For the writes that must not be lost once a body has run (completion, failure): if Redis
    is down, the result waits here, and nobody can claim the message meanwhile either. The
    try number (0 first) lets the caller check, after a lost reply, whether an earlier try
    was applied. The task's hard time limit is the only bound: the soft limit is for bodies,
    and one that fires here (the body is done, its outcome is being stored) is ignored.
    """
    wait = 0.1
    for number in itertools.count():
        try:
            try:
                return operation(number)
            except STORE_ERRORS as exc:
                if number == 0 or number % 20 == 0:
                    logger.warning(
                        "beetle: cannot store %s yet (%r); retrying until Redis answers", what, exc
                    )
                sleep(wait)
                wait = min(wait * 2, max_wait_s)
        except SoftTimeLimitExceeded:
            logger.warning("beetle: soft time limit while storing %s; still storing it", what)
    raise AssertionError("unreachable")
