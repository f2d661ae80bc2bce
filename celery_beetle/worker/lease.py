"""Keep a run's lease alive while its body runs, where the pool cannot cut the body short.

A BeetleTask run holds a lease of ``timeout`` seconds in the dedup store; when it runs out,
another worker may claim the message and run it again. Under the prefork pool the task's hard
time limit (derived from the lease, :func:`celery_beetle.task.time_limits_for`) kills a body
before its lease ends, so two runs never overlap. The solo and threads pools cannot enforce
time limits, and gevent and eventlet only cooperatively (a body that does not yield is never
interrupted): there a slow body can outlive its lease and overlap with a takeover run.

:class:`LeaseKeeper` closes that gap. Started when the body starts, it extends the lease
(:meth:`~celery_beetle.store.base.Store.extend`, fenced by the claim's token) every third of the
lease from a daemon thread, until :meth:`LeaseKeeper.stop` when the body ends:

* a store error (:data:`~celery_beetle.store.health.STORE_ERRORS`) is logged and retried at
  the next beat, sooner when the lease's end is near;
* ``NOT_OWNER`` means the lease was taken over: the keeper stops and sets ``lost``, so the
  run knows its completion will be refused;
* any other exception is logged with its traceback and the keeper keeps trying: a heartbeat
  must never take the pool process down with it.

:func:`pool_enforces_time_limits` tells the run whether it needs a keeper at all.

Under gevent or eventlet with monkey-patching the keeper's thread is a greenlet: a body that
never yields starves it as well, so the keeper helps only bodies that do I/O there.

Time: the keeper reads the store's clock (milliseconds, the clock the store passes to its
scripts, so the deadlines it compares are the stored ones) and waits on an Event, so
:meth:`~LeaseKeeper.stop` ends it at once; tests inject both and never sleep.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from celery.concurrency.prefork import TaskPool as PreforkPool

from celery_beetle.store import Store
from celery_beetle.store.health import STORE_ERRORS
from celery_beetle.store.outcome import Fence
from celery_beetle.store.state import MessageFacts

__all__ = ["LeaseKeeper", "pool_enforces_time_limits"]

logger = logging.getLogger(__name__)

#: The pool names (``--pool``, ``worker_pool``) whose time limits kill a body by force.
_ENFORCING_POOL_NAMES = frozenset(
    {"prefork", "processes", "billiard", "celery.concurrency.prefork.taskpool"}
)


def pool_enforces_time_limits(pool: Any) -> bool:
    """Whether the pool kills a body at its hard time limit, so its lease cannot be outlived.

    ``pool``: a name (``"prefork"``, ``"solo"``, ``"celery.concurrency.prefork:TaskPool"``),
    a pool class or a pool instance. True for prefork (billiard); False for solo, threads,
    gevent, eventlet (cooperative only) and custom pools, which then need a
    :class:`LeaseKeeper`: assuming enforcement where there is none would let runs overlap.
    """
    if isinstance(pool, str):
        return pool.strip().lower().replace(":", ".") in _ENFORCING_POOL_NAMES
    cls = pool if isinstance(pool, type) else type(pool)
    return issubclass(cls, PreforkPool) or cls.__module__.partition(".")[0] == "billiard"


class LeaseKeeper:
    """Extends one run's lease from a daemon thread until :meth:`stop`.

    ``lease_deadline_ms``: the claim's deadline (the store's clock); default: now plus the
    lease. ``interval_s``: between extensions (default a third of the lease, so one lost
    extension still leaves a third of the lease for the next). ``min_retry_s``: the shortest
    wait between retries after a store error near the lease's end. ``clock``: milliseconds,
    default the store's. ``wait(seconds)``: returns True to stop; default an Event wait that
    :meth:`stop` interrupts.

    Read after :meth:`stop`: ``lost`` (the lease was taken over), ``extensions`` (accepted),
    ``failures`` (errors), ``lease_deadline_ms`` (the last known deadline).
    """

    def __init__(
        self,
        store: Store,
        facts: MessageFacts,
        token: int,
        lease_timeout_ms: int,
        *,
        lease_deadline_ms: int | None = None,
        interval_s: float | None = None,
        min_retry_s: float = 0.05,
        join_timeout_s: float = 1.0,
        clock: Callable[[], int] | None = None,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        if lease_timeout_ms <= 0:
            raise ValueError(f"lease_timeout_ms must be positive, got {lease_timeout_ms}")
        if interval_s is not None and interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.store = store
        self.facts = facts
        self.token = token
        self.lease_timeout_ms = lease_timeout_ms
        self.interval_s = interval_s if interval_s is not None else lease_timeout_ms / 3000
        self.min_retry_s = min_retry_s
        self.join_timeout_s = join_timeout_s
        self.clock = clock or store.clock
        self._stopped = threading.Event()
        self._wait = wait or self._stopped.wait
        self._thread: threading.Thread | None = None
        self.lease_deadline_ms = (
            lease_deadline_ms if lease_deadline_ms is not None else self.clock() + lease_timeout_ms
        )
        self.lost = False
        self.extensions = 0
        self.failures = 0

    def __repr__(self) -> str:
        return (
            f"<LeaseKeeper {self._name()} token={self.token} every {self.interval_s:g}s "
            f"extensions={self.extensions} lost={self.lost}>"
        )

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start extending; the first extension is one interval from now."""
        if self._thread is not None:
            raise RuntimeError(f"{self!r} was started already; build one keeper per run")
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"beetle-lease {self._name()}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop extending; safe to call twice, before :meth:`start`, or after a takeover.

        Waits at most ``join_timeout_s`` for an extension in flight (a hung Redis): the run
        must get on with recording its outcome, which the fencing token keeps correct.
        """
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.join_timeout_s)

    # -- the thread -------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        delay_s = self.interval_s
        while not self._stopped.is_set():
            if self._wait(delay_s) or self._stopped.is_set():
                return
            delay_s = self._beat()

    def _beat(self) -> float:
        """One extension; the seconds until the next."""
        now_ms = self.clock()
        try:
            decision = self.store.extend(self.facts, self.token, self.lease_timeout_ms)
        except STORE_ERRORS as exc:
            self.failures += 1
            delay_s = self._retry_delay_s(now_ms)
            logger.warning(
                "beetle: cannot extend the lease of %s (%r); trying again in %.2f s",
                self._name(),
                exc,
                delay_s,
            )
            return delay_s
        except Exception:
            self.failures += 1
            delay_s = self._retry_delay_s(now_ms)
            logger.exception(
                "beetle: extending the lease of %s failed; trying again in %.2f s",
                self._name(),
                delay_s,
            )
            return delay_s
        if decision.outcome is Fence.NOT_OWNER:
            if self._stopped.is_set():  # stop() came while this was in flight: the run is over
                return 0.0
            self.lost = True
            self._stopped.set()
            logger.warning(
                "beetle: the lease of %s was taken over (stored status %s, token %s; ours %s): "
                "another run may be under way, and this one's outcome will be refused",
                self._name(),
                decision.status.name.lower() if decision.status else None,
                decision.token,
                self.token,
            )
            return 0.0
        self.extensions += 1
        self.lease_deadline_ms = decision.lease_deadline_ms or now_ms + self.lease_timeout_ms
        return self.interval_s

    def _retry_delay_s(self, now_ms: int) -> float:
        """The usual interval, or half the time left when the lease ends before then."""
        remaining_s = (self.lease_deadline_ms - now_ms) / 1000
        if remaining_s <= 0:  # ended already: the next extension still wins if nobody claimed
            return self.interval_s
        return min(self.interval_s, max(remaining_s / 2, self.min_retry_s))

    def _name(self) -> str:
        return f"{self.facts.queue}/{self.facts.message_id}"
