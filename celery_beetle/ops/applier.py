"""Applying policies from workers: in the background, one worker of a fleet per round.

:class:`PolicyApplier` runs :func:`~celery_beetle.ops.policies.apply` on a daemon thread,
every ``interval_s``: a broker that was unreachable (or is new, or came back empty) is caught
up at the next round, and nothing here ever blocks or fails publishing or consuming.
"Installing queue policies from thousands of worker processes can easily bring down a
RabbitMQ server" (XING's beetle): a :class:`FleetLock` in Redis lets one worker of a fleet do
each round, so 500 workers starting together make one round of management calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from celery_beetle.ops.management import ManagementClient
from celery_beetle.ops.policies import BrokerPlan, PolicyConfig, apply

__all__ = ["FleetLock", "PolicyApplier"]

logger = logging.getLogger(__name__)


class FleetLock:
    """One holder per ``ttl_ms`` among every process that shares a Redis: ``SET NX PX``.

    The lock is not released after a round: it stands for "this round is done (or being
    done)", so the rest of a fleet that starts together skips its round instead of
    repeating it. A holder that dies simply lets it expire.
    """

    def __init__(self, client: Any, key: str, ttl_ms: int) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = ttl_ms

    def acquire(self, owner: str) -> bool:
        """True if this process does the round. An unreachable Redis skips the round (the
        worker does not consume meanwhile either); the next round tries again."""
        import redis

        try:
            return bool(self.client.set(self.key, owner, nx=True, px=self.ttl_ms))
        except redis.RedisError as exc:
            logger.warning("beetle: no queue policy round: the fleet lock is unavailable (%r)", exc)
            return False


class PolicyApplier:
    """Keeps every broker's policies as configured, from a daemon thread.

    Each round (every ``interval_s``) calls :func:`apply` on every broker, unless a
    :class:`FleetLock` says another process has done this round. A broker whose API did
    not answer is logged and tried again next round, so a broker that comes back, or one
    added later, gets its policies within one interval; nothing here ever blocks or fails
    publishing or consuming.
    """

    def __init__(
        self,
        clients: Sequence[ManagementClient],
        queues: Iterable[str],
        config: PolicyConfig,
        *,
        interval_s: float = 30.0,
        lock: FleetLock | None = None,
        owner: str = "",
        on_round: Callable[[list[BrokerPlan]], None] | None = None,
    ) -> None:
        self.clients = list(clients)
        self.queues = sorted(set(queues))
        self.config = config
        self.interval_s = interval_s
        self.lock = lock
        self.owner = owner
        self.on_round = on_round
        self.rounds = 0
        self.unreachable: set[str] = set()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[BrokerPlan] | None:
        """One round: None if another process holds the round."""
        if self.lock is not None and not self.lock.acquire(self.owner):
            return None
        plans = apply(self.clients, self.queues, self.config)
        self.rounds += 1
        for broker_plan in plans:
            if broker_plan.error is not None:
                if broker_plan.broker not in self.unreachable:
                    logger.warning(
                        "beetle: cannot apply queue policies on %s: %s",
                        broker_plan.broker,
                        broker_plan.error,
                    )
                self.unreachable.add(broker_plan.broker)
                continue
            if broker_plan.broker in self.unreachable:
                logger.info("beetle: %s answers again; policies checked", broker_plan.broker)
                self.unreachable.discard(broker_plan.broker)
            for change in broker_plan.changes:
                logger.info("beetle: %s", change.describe())
            for item in broker_plan.drift:
                logger.warning("beetle: queue policy drift: %s", item.describe())
        if self.on_round is not None:
            self.on_round(plans)
        return plans

    def start(self) -> PolicyApplier:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="beetle-policies", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopped.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:  # the thread must outlive a bug; it is logged loudly
                logger.exception("beetle: applying queue policies failed")
            self._stopped.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
