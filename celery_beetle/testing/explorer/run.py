"""One scenario's processes and files: the servers, the worker slots, the relay.

:class:`Cluster` holds the batch's servers (three RabbitMQ nodes, a Redis, a PostgreSQL when
a scenario needs one, a TCP proxy in front of each; a Sentinel-managed master and replica
and the previous release's code when a scenario needs them); a :class:`Run` gives one scenario a
fresh vhost, an empty Redis and a fresh database on them, its worker slots (:class:`Fleet`:
``celery worker`` subprocesses of :mod:`.app`) and, with the outbox, its relay
(:mod:`.relay`). The publisher (:mod:`.publish`) and the nemesis (:mod:`.faults`) are handed
the run; :mod:`.runner` runs and judges it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from celery_beetle.testing.explorer import checker
from celery_beetle.testing.explorer.relay import RelayProcess
from celery_beetle.testing.explorer.scenario import (
    CONSUMER_TIMEOUT_MS,
    DELIVERY_LIMIT,
    SECOND_QUEUE,
    Item,
    Scenario,
)
from celery_beetle.testing.proxy import TcpProxy
from celery_beetle.testing.rabbit import RabbitNode, beetle_url, start_all
from celery_beetle.testing.redis_server import RedisServer
from celery_beetle.testing.sentinel import SentinelSet
from celery_beetle.testing.worker import WorkerProcess

__all__ = ["FAST", "QUEUE", "Cluster", "Fleet", "Run"]

#: short transport timeouts, so that a fault is noticed and healed within seconds
FAST = {
    "confirm_timeout": 1.0,
    "reconnect_interval": 0.2,
    "reconnect_max_interval": 1.0,
    "connect_timeout": 1.0,
}
QUEUE = "explore"
ROOT = Path(__file__).resolve().parents[3]


class Cluster:
    """The batch's servers; :meth:`close` kills every one of them by pid."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.nodes = [RabbitNode(base / f"rabbit{i}") for i in range(3)]
        self.redis = RedisServer(base / "redis", appendonly=True)
        self.pg: Any = None
        self._vhosts: list[str] = []
        #: a TCP proxy in front of every node and of Redis: clients connect through them, so
        #: the nemesis can cut, stall or hold a link without touching the server
        self.proxies: list[TcpProxy] = []
        self.redis_proxy: TcpProxy | None = None
        #: whether a scenario lowered the nodes' ``consumer_timeout`` (put back by :meth:`fresh`)
        self.lowered = False
        #: a Sentinel-managed master and replica, started for the first scenario that needs it
        self.sentinel: SentinelSet | None = None
        #: the previous release's directory (or None) and what to say of it, found once
        self._previous: tuple[Path | None, str] | None = None

    def start(self) -> Cluster:
        start_all(self.nodes)
        self.redis.start()
        self.proxies = [TcpProxy(n.host, n.port).start() for n in self.nodes]
        self.redis_proxy = TcpProxy(self.redis.host, self.redis.port).start()
        return self

    @property
    def redis_url(self) -> str:
        assert self.redis_proxy is not None
        return f"redis://{self.redis_proxy.host_port}/0"

    def sentinels(self) -> SentinelSet:
        """The batch's Sentinel set (a master, a replica, a Sentinel), started once."""
        if self.sentinel is None:
            self.sentinel = SentinelSet(self.base / "sentinel")
            self.sentinel.start()
        return self.sentinel

    def previous_release(self) -> tuple[Path | None, str]:
        """The previous release's code for a worker slot (:mod:`.previous`), once a batch."""
        if self._previous is None:
            from celery_beetle.testing.explorer.previous import checkout

            self._previous = checkout(self.base)
        return self._previous

    def postgres(self) -> Any:
        if self.pg is None:
            from celery_beetle.testing.postgres import PostgresServer

            self.pg = PostgresServer(self.base / "pg").start()
        elif not self.pg.is_running:
            self.pg.start()
        return self.pg

    def heal(self, destroyed: frozenset[int] = frozenset()) -> None:
        """Every server up, unfrozen, reachable and accepting writes (what a fault left),
        but the nodes ``destroyed`` for good in the running scenario, which stay down until
        it is judged."""
        for proxy in [*self.proxies, self.redis_proxy]:
            if proxy is not None and (proxy.state != "forwarding" or proxy.delay_ms):
                proxy.restore()
        for node in self.nodes:
            if node.is_paused:
                node.resume()
        dead = [
            node for n, node in enumerate(self.nodes) if not node.is_running and n not in destroyed
        ]
        if dead:
            start_all(dead)
        if self.redis.is_paused:
            self.redis.resume()
        if not self.redis.is_running:
            self.redis.start()
        with self.redis.client() as client:
            client.config_set("maxmemory", 0)
        if self.sentinel is not None:
            self.sentinel.heal()

    def fresh(self) -> str:
        """A vhost of its own on every node and an empty Redis, for the next scenario."""
        self.heal()
        for vhost in self._vhosts:  # the previous scenario's
            for node in self.nodes:
                with contextlib.suppress(Exception):
                    node.delete_vhost(vhost)
        if self.lowered:  # by a scenario that did not end cleanly
            for node in self.nodes:
                set_consumer_timeout(node, CONSUMER_TIMEOUT_MS)
            self.lowered = False
        vhost = f"explore-{uuid.uuid4().hex[:10]}"
        for node in self.nodes:
            node.create_vhost(vhost)
        self._vhosts = [vhost]
        with self.redis.client() as client:
            client.flushall()
        if self.sentinel is not None:
            with self.sentinel.master().client() as client:
                client.flushall()
        return vhost

    def close(self) -> None:
        for proxy in [*self.proxies, self.redis_proxy]:
            if proxy is not None:
                with contextlib.suppress(Exception):
                    proxy.close()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill()
        with contextlib.suppress(Exception):
            self.redis.kill()
        if self.sentinel is not None:
            with contextlib.suppress(Exception):
                self.sentinel.stop()
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.kill()
            with contextlib.suppress(Exception):
                self.pg.remove()  # its data dir may be outside self.base (see PostgresServer)


class Fleet:
    """The scenario's worker slots; a slot is refilled after a fault emptied it."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.conf: dict[str, Any] = {
            "worker_prefetch_multiplier": run.scenario.settings.prefetch_multiplier,
            **run.app_conf,
        }
        self.slots: list[WorkerProcess | None] = [None] * run.scenario.settings.workers
        #: the slot that runs the previous release until ``worker_upgrade`` (None: none)
        self.previous_slot = len(self.slots) - 1 if run.previous_root else None
        self.every: list[WorkerProcess] = []
        self._lock = threading.Lock()

    def start(self, slot: int) -> None:
        run, settings = self.run, self.run.scenario.settings
        with self._lock:
            n = len(self.every)
        worker = WorkerProcess(
            "celery_beetle.testing.explorer.app",
            run.base / f"worker{n}.log",
            run.env(self.conf, traced=slot >= settings.untraced),
            pool=settings.pool,
            concurrency=settings.concurrency,
            queue=",".join(run.queues),
            name=f"ex{slot}",
            root=run.previous_root if slot == self.previous_slot else ROOT,
        )
        with self._lock:
            self.every.append(worker)
        self.slots[slot] = worker.start(ready_timeout=90)

    def start_all(self) -> None:
        with ThreadPoolExecutor(len(self.slots)) as pool:
            list(pool.map(self.start, range(len(self.slots))))

    def fill(self) -> None:
        for slot, worker in enumerate(self.slots):
            if worker is None or not worker.alive():
                self.start(slot)

    def stop(self) -> None:
        with ThreadPoolExecutor(max(1, len(self.every))) as pool:
            list(pool.map(lambda w: w.stop(timeout=30), self.every))
        for worker in self.every:
            worker.kill()


class Run:
    """One scenario's processes and files."""

    def __init__(self, cluster: Cluster, scenario: Scenario, base: Path) -> None:
        self.cluster, self.scenario, self.base = cluster, scenario, base
        self.trace = base / "trace"
        self.ledger = base / "ledger"
        for d in (self.trace, self.ledger):
            d.mkdir(parents=True, exist_ok=True)
        self.queue = QUEUE
        self.nonce = uuid.uuid4().hex[:6]
        self.nodes = cluster.nodes[: scenario.settings.brokers]
        self.proxies = cluster.proxies[: scenario.settings.brokers]
        self.vhost = cluster.fresh()
        self.url = beetle_url([p.host_port for p in self.proxies], self.vhost)
        #: the dedup store: the batch's Redis through its proxy, or a Sentinel-managed master
        self.sentinel = cluster.sentinels() if scenario.settings.sentinel else None
        self.redis_url = self.sentinel.url if self.sentinel else cluster.redis_url
        self.db_url: str | None = None
        if scenario.settings.inbox or scenario.settings.outbox:
            self.db_url = _new_database(cluster.postgres())
        self.transport_options = FAST
        #: app.conf for the workers, the publisher and the relay (a scope shared by two queues)
        self.app_conf: dict[str, Any] = {}
        self.queues = [self.queue]
        if scenario.settings.shared_scope:
            self.queues.append(SECOND_QUEUE)
            self.app_conf["beetle_dedup_scopes"] = {SECOND_QUEUE: self.queue}
        if scenario.chords:
            # Celery's chords count their header in a result backend: the run's Redis (its
            # process faults reach it), straight, not through the dedup store's proxy
            redis = cluster.redis
            self.app_conf["result_backend"] = f"redis://{redis.host}:{redis.port}/1"
        if scenario.settings.wait_replicas:
            self.app_conf["beetle_redis_wait_replicas"] = scenario.settings.wait_replicas
        if scenario.settings.rabbit4:
            self.app_conf["task_default_queue_type"] = "quorum"
            for node in self.nodes:
                self.limit(node)
        #: indexes (into ``nodes``) of brokers destroyed for good in this run
        self.destroyed: set[int] = set()
        #: indexes of brokers replaced by an empty node in this run (what they held is gone)
        self.replaced: set[int] = set()
        #: what the run says beside its verdict (the previous release it ran, or why not)
        self.notes: list[str] = []
        self.previous_root: Path | None = None
        if scenario.settings.previous:
            self.previous_root, said = cluster.previous_release()
            self.notes.append(said)
        #: an outbox row's id is its task id, a UUID (the outbox's own time-ordered kind,
        #: made in the order of the enqueues, so a key's rows are published in that order)
        from celery_beetle.outbox.ids import new_id

        enqueues = sorted((i for i in scenario.items if i.kind == "outbox"), key=lambda i: i.at_s)
        self.outbox_ids = {item.index: new_id() for item in enqueues}
        self.fleet = Fleet(self)
        self.relay = (
            RelayProcess(self.db_url or "", self.env, base) if scenario.settings.outbox else None
        )
        self.started = time.monotonic()

    def env(self, conf: dict[str, Any] | None = None, *, traced: bool = True) -> dict[str, str]:
        """The environment :mod:`.app` is configured from (workers, the relay); ``traced``
        False: a worker with tracing off."""
        return {
            "EXPLORER_URL": self.url,
            "EXPLORER_REDIS": self.redis_url,
            "EXPLORER_QUEUE": self.queue,
            "EXPLORER_TRACE": str(self.trace) if traced else "",
            "EXPLORER_LEDGER": str(self.ledger),
            "EXPLORER_TASK": json.dumps(self.scenario.settings.task_options()),
            "EXPLORER_CONF": json.dumps(self.fleet.conf if conf is None else conf),
            "EXPLORER_OPTIONS": json.dumps(self.transport_options),
            "EXPLORER_DB": self.db_url or "",
        }

    def heal(self) -> None:
        self.cluster.heal(frozenset(self.destroyed))
        if self.scenario.settings.consumer_timeout_ms:
            for n, node in enumerate(self.nodes):  # a node restarted has the default again
                if n not in self.destroyed:
                    set_consumer_timeout(node, self.scenario.settings.consumer_timeout_ms)

    def limit(self, node: RabbitNode) -> None:
        """RabbitMQ 4's limits on ``node`` (settings ``rabbit4``): a ``delivery-limit`` of
        20 on the run's vhost by operator policy, and the scenario's ``consumer_timeout``."""
        definition = json.dumps({"delivery-limit": DELIVERY_LIMIT})
        node.ctl(
            "set_operator_policy", "-p", self.vhost, "rabbitmq-4-limit", ".*", definition,
            "--apply-to", "queues",
        )  # fmt: skip
        if self.scenario.settings.consumer_timeout_ms:
            self.cluster.lowered = True
            set_consumer_timeout(node, self.scenario.settings.consumer_timeout_ms)

    def unlimit(self) -> None:
        """The default ``consumer_timeout`` back on every node the run lowered it on (the
        operator policy goes with the vhost)."""
        if not self.scenario.settings.consumer_timeout_ms:
            return
        failed = False  # a node restarted meanwhile has the default again
        for n, node in enumerate(self.nodes):
            if n not in self.destroyed and node.is_running:
                try:
                    set_consumer_timeout(node, CONSUMER_TIMEOUT_MS)
                except Exception:
                    failed = True  # :meth:`Cluster.fresh` tries again
        self.cluster.lowered = failed

    def key(self, item: Item) -> str:
        if item.kind == "outbox":
            return self.outbox_ids[item.index]
        return f"s{self.scenario.seed}-{item.index}-{self.nonce}"

    def resolved(
        self, trace: checker.Trace, keys: set[str], dead: dict[str, set[str]] | None = None
    ) -> set[str]:
        """The ``keys`` with an outcome: in the trace, or among the ``dead`` letters
        RabbitMQ wrote (a TTL or a max-length), or any dead letter when a worker with tracing
        off may have written it."""
        untraced = bool(self.scenario.settings.untraced)
        by_broker = {
            k for k, reasons in (dead or {}).items() if untraced or checker.by_broker(reasons)
        }
        return {k for k in keys if trace.is_completed(k) or trace.dead.get(k) or k in by_broker}


#: how often a RabbitMQ 3.x channel checks its consumer timeout (``channel_tick_interval``)
TICK_MS = 60_000


def set_consumer_timeout(node: RabbitNode, timeout_ms: int) -> None:
    """RabbitMQ's ``consumer_timeout`` on a running node. A 3.x channel checks it on its
    tick, once a minute by default, longer than a scenario holds a delivery: below the
    default the tick is made one second (each channel reads it as it sets its next tick)."""
    tick = TICK_MS if timeout_ms >= CONSUMER_TIMEOUT_MS else 1000
    node.ctl(
        "eval",
        f"application:set_env(rabbit, consumer_timeout, {int(timeout_ms)}), "
        f"application:set_env(rabbit, channel_tick_interval, {tick}).",
    )


def _new_database(pg: Any) -> str:
    from celery_beetle.outbox.db import engine_for
    from celery_beetle.outbox.table import create_tables
    from celery_beetle.testing.explorer.app import EFFECTS

    url = str(pg.create_database(f"x_{uuid.uuid4().hex[:12]}"))
    engine = engine_for(url)
    create_tables(engine)
    EFFECTS.metadata.create_all(engine)
    engine.dispose()
    return url
