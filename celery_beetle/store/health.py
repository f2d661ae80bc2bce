"""Is the dedup store usable? The errors that mean "not now", and a cheap probe.

Nothing may run without a claim, so when Redis stops answering, or stops taking writes, the
worker must stop taking messages and start again by itself once Redis is back (a restart, a
Sentinel failover, a Cluster resharding, memory freed). Both halves of the worker need to tell
"the store is unavailable" apart from a bug: :func:`store_unavailable` says which. Neither
kind may end with a message acked whose outcome is not stored: an unavailable store pauses
the worker, and an error nobody foresaw hands the message back (and is logged in full).

The gate probes with :class:`RedisProbe`, a separate client with short timeouts, so that while
Redis hangs (SIGSTOP, a partition) the worker's event loop blocks for a fraction of a second
per probe, not for the store's five-second socket timeout. The probe writes (a key with a
short TTL), because a Redis out of memory or unable to persist still answers ``PING``; and
with ``wait_replicas`` it waits for that many replicas to acknowledge the write, as every
write of the store does, so a master just promoted without a replica is not taken for a
store that answers.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from billiard.exceptions import SoftTimeLimitExceeded
from redis import exceptions as redis_errors

from celery_beetle.store.address import connect

__all__ = ["STORE_ERRORS", "RedisProbe", "call_until_stored", "store_unavailable"]

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
    redis_errors.OutOfMemoryError,
    redis_errors.MasterDownError,
    OSError,
)

#: The error codes with which a healthy-but-busy or unwritable Redis refuses a command
#: (also when a script's own call is refused): out of memory under ``noeviction``, a
#: script running too long, a failed RDB save with ``stop-writes-on-bgsave-error``, a
#: replica without its master, too few replicas for ``min-replicas-to-write``, loading.
UNAVAILABLE_CODES = frozenset(
    ("OOM", "BUSY", "MISCONF", "MASTERDOWN", "NOREPLICAS", "LOADING", "READONLY",
     "CLUSTERDOWN", "TRYAGAIN")
)  # fmt: skip


def store_unavailable(exc: BaseException) -> bool:
    """True if ``exc`` says the store cannot serve us now (pause and try again later);
    False for anything else, which is a bug or bad data: hand the message back."""
    if isinstance(exc, STORE_ERRORS):
        return True
    if isinstance(exc, redis_errors.ResponseError):
        text = str(exc)
        code = text.split(" ", 1)[0].upper()
        if code in UNAVAILABLE_CODES:
            return True
        # an error a script's redis.call() met: "Error running script ...: OOM command ..."
        return any(f" {c} " in f" {text} " or f": {c} " in text for c in UNAVAILABLE_CODES)
    return False


class RedisProbe:
    """Answers "does Redis take a write as the store's writes need it?" within ``timeout_s``,
    never raising; :attr:`last_error` says why not."""

    def __init__(
        self, url: str, timeout_s: float = 0.5, key: str = "beetle:probe", wait_replicas: int = 0
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.key = key
        self.wait_replicas = wait_replicas
        #: ``WAIT`` gives up before the socket does, so a missing replica is a clear answer
        self.wait_timeout_ms = max(1, round(timeout_s * 600))
        self.last_error: BaseException | None = None
        self._client: Any = None

    def __call__(self) -> bool:
        try:
            if self._client is None:
                self._client = connect(
                    self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
                )
            # a write, not PING: the store must take the claims that resuming will send
            if not self.wait_replicas:
                self._client.set(self.key, 1, px=10_000)
            else:
                self._write_and_wait()
        except Exception as exc:  # any failure means "not yet"; the gate tries again
            logger.debug("beetle: Redis probe failed: %r", exc)
            self.last_error = exc
            self._reset()
            return False
        self.last_error = None
        return True

    def _write_and_wait(self) -> None:
        """The write and ``WAIT`` in one pipeline, on one connection, as the store sends them."""
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self.key, 1, px=10_000)
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        _, acked = pipe.execute()
        if int(acked) < self.wait_replicas:
            raise redis_errors.TimeoutError(
                f"{acked} of {self.wait_replicas} replica(s) acknowledged the probe's write "
                f"within {self.wait_timeout_ms} ms"
            )

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
    is down, the result waits here, and nobody can claim the message meanwhile either. Every
    error is retried, not only an unavailable store's: the body ran, so giving up would
    either ack a message whose outcome is not stored or run it again. The try number (0
    first) lets the caller's write be recognised as its own after a lost reply. The task's
    hard time limit is the only bound (it kills the pool process, and the message goes back
    to its queue), and a pool process's limits wait for its outcome, at most one hard limit
    more (:func:`celery_beetle.worker.time_limits.storing_the_outcome`); the soft limit is
    for bodies, and one that fires here is ignored. A wait
    is said once as it begins and once as it ends; an error not understood, in full every
    20 tries.
    """
    wait = 0.1
    began = time.monotonic()
    said = False  # the first failure is a WARNING, and then so is the success
    for number in itertools.count():
        try:
            try:
                result = operation(number)
            except SoftTimeLimitExceeded:
                raise  # handled below: not an error of the store's
            except Exception as exc:
                if not store_unavailable(exc):  # not understood: in full, now and then
                    if number % 20 == 0:
                        logger.exception("beetle: storing %s failed unexpectedly; retrying", what)
                    said = True
                elif not said:
                    logger.warning(
                        "beetle: cannot store %s yet (%r); retrying until Redis takes it",
                        what,
                        exc,
                    )
                    said = True
                else:
                    logger.debug("beetle: cannot store %s yet (%r)", what, exc)
                sleep(wait)
                wait = min(wait * 2, max_wait_s)
                continue
            if said:
                logger.warning(
                    "beetle: stored %s after %.1f s and %d tries",
                    what,
                    time.monotonic() - began,
                    number + 1,
                )
            return result
        except SoftTimeLimitExceeded:
            logger.warning("beetle: soft time limit while storing %s; still storing it", what)
    raise AssertionError("unreachable")
