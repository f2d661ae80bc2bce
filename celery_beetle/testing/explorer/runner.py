"""Running one scenario on real servers: start, publish, injure, heal, drain, inspect, judge.

The servers (three RabbitMQ nodes, a Redis with ``appendfsync always`` so that a kill -9
loses no acknowledged write, a PostgreSQL for the inbox) start once per batch
(:class:`Cluster`, ~5 s a node); each scenario gets a fresh vhost on every node, an empty
Redis and a fresh database, so scenarios share nothing but the processes. Workers are
``celery worker`` subprocesses of :mod:`.app` (killable by pid), the publisher
(:mod:`.publish`) a thread of this process publishing each item at its time, the nemesis
(:mod:`.faults`) a thread, and with the outbox a ``beetle relay`` subprocess (:mod:`.relay`).

A run ends by itself: after the last publish and the last fault every server is healed and
every worker slot filled; the run then waits (bounded) until every confirmed BeetleTask has
an outcome in the trace, waits one lease more (a late dead letter of a message that looked
completed must be seen), stops the workers warmly and reads what the brokers still hold.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery_beetle.audit import naive
from celery_beetle.testing.explorer import checker
from celery_beetle.testing.explorer.faults import Nemesis
from celery_beetle.testing.explorer.ledger import read_dir
from celery_beetle.testing.explorer.publish import Publisher
from celery_beetle.testing.explorer.relay import RelayProcess
from celery_beetle.testing.explorer.scenario import SECOND_QUEUE, Item, Scenario
from celery_beetle.testing.proxy import TcpProxy
from celery_beetle.testing.rabbit import RabbitNode, beetle_url, start_all
from celery_beetle.testing.redis_server import RedisServer
from celery_beetle.testing.worker import WorkerProcess

__all__ = ["Cluster", "Outcome", "Run", "run_scenario"]

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

    def fresh(self) -> str:
        """A vhost of its own on every node and an empty Redis, for the next scenario."""
        self.heal()
        for vhost in self._vhosts:  # the previous scenario's
            for node in self.nodes:
                with contextlib.suppress(Exception):
                    node.delete_vhost(vhost)
        vhost = f"explore-{uuid.uuid4().hex[:10]}"
        for node in self.nodes:
            node.create_vhost(vhost)
        self._vhosts = [vhost]
        with self.redis.client() as client:
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
        self.every: list[WorkerProcess] = []
        self._lock = threading.Lock()

    def start(self, slot: int) -> None:
        run, settings = self.run, self.run.scenario.settings
        with self._lock:
            n = len(self.every)
        worker = WorkerProcess(
            "celery_beetle.testing.explorer.app",
            run.base / f"worker{n}.log",
            run.env(self.conf),
            pool=settings.pool,
            concurrency=settings.concurrency,
            queue=",".join(run.queues),
            name=f"ex{slot}",
            root=ROOT,
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


@dataclass
class Outcome:
    scenario: Scenario
    violations: list[checker.Violation]
    faults: Counter[str]
    messages: int
    elapsed_s: float
    base: Path
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.violations)


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
        self.redis_url = cluster.redis_url
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
        #: indexes (into ``nodes``) of brokers destroyed for good in this run
        self.destroyed: set[int] = set()
        #: an outbox row's id is its task id, a UUID (the outbox's own time-ordered kind,
        #: made in the order of the enqueues, so a key's rows are published in that order)
        from celery_beetle.outbox.ids import new_id

        enqueues = sorted((i for i in scenario.items if i.kind == "outbox"), key=lambda i: i.at_s)
        self.outbox_ids = {item.index: new_id() for item in enqueues}
        self.fleet = Fleet(self)
        self.relay = RelayProcess(self) if scenario.settings.outbox else None
        self.started = time.monotonic()

    def env(self, conf: dict[str, Any] | None = None) -> dict[str, str]:
        """The environment :mod:`.app` is configured from (workers, the relay)."""
        return {
            "EXPLORER_URL": self.url,
            "EXPLORER_REDIS": self.redis_url,
            "EXPLORER_QUEUE": self.queue,
            "EXPLORER_TRACE": str(self.trace),
            "EXPLORER_LEDGER": str(self.ledger),
            "EXPLORER_TASK": json.dumps(self.scenario.settings.task_options()),
            "EXPLORER_CONF": json.dumps(self.fleet.conf if conf is None else conf),
            "EXPLORER_OPTIONS": json.dumps(self.transport_options),
            "EXPLORER_DB": self.db_url or "",
        }

    def heal(self) -> None:
        self.cluster.heal(frozenset(self.destroyed))

    def key(self, item: Item) -> str:
        if item.kind == "outbox":
            return self.outbox_ids[item.index]
        return f"s{self.scenario.seed}-{item.index}-{self.nonce}"

    def resolved(self, trace: checker.Trace, keys: set[str]) -> set[str]:
        return {k for k in keys if trace.is_completed(k) or trace.dead.get(k)}


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


def _effects(db_url: str | None) -> Counter[str]:
    if not db_url:
        return Counter()
    import sqlalchemy as sa

    from celery_beetle.outbox.db import engine_for

    engine = engine_for(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT key, count(*) FROM explorer_effects GROUP BY key"))
        out = Counter({str(k): int(c) for k, c in rows})
    engine.dispose()
    return out


def _inspect(run: Run) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """Dead letters per key (with reasons), and the keys of what is left in the scenario's
    other queues (taken out: the scenario is over)."""
    dead: dict[str, set[str]] = {}
    left: dict[str, list[str]] = {}
    for n, node in enumerate(run.nodes):
        if n in run.destroyed:
            continue  # gone for good, with what it held
        for queue, (ready, unacked) in node.queue_depths(run.vhost).items():
            if not ready + unacked:
                continue
            where = f"{node.host_port}/{queue}"
            for _method, props, _body in node.get_messages(run.vhost, queue):
                headers = props.headers or {}
                key = str(headers.get("id") or props.correlation_id or "?")
                if ":retry-" in str(props.message_id):  # a self.retry: its own message
                    key = str(props.message_id)
                if queue.endswith(".dead"):
                    dead.setdefault(key, set()).add(str(headers.get("x-beetle-dead-reason")))
                else:
                    left.setdefault(where, []).append(key)
            if unacked and not queue.endswith(".dead"):
                left.setdefault(where, []).append(f"{unacked} unacked")
    return dead, left


def drain_deadline_s(scenario: Scenario) -> float:
    """Long enough for every body to run on the scenario's pool slots, plus its leases: a
    single solo worker with many long bodies needs minutes (soak seeds 3021 and 3047 were
    judged "lost" while their worker was still busy)."""
    s = scenario.settings
    countdown = max((i.countdown_s for i in scenario.items), default=0.0)
    slots = max(1, s.workers * s.concurrency)
    return min(
        300.0, countdown + body_seconds(scenario) / slots + s.timeout_s * (s.attempts + 2) + 45
    )


def body_seconds(scenario: Scenario) -> float:
    """How long the bodies of ``scenario`` sleep in all, each start of each (explorer app)."""
    s = scenario.settings
    total = 0.0
    for item in scenario.items:
        if item.kind == "work" and item.mode == "long":
            seconds = s.timeout_s / 2
        elif item.kind == "work" and item.mode == "overrun":
            seconds = s.timeout_s * 1.5
        elif item.kind == "retry":  # each retry a run, after its countdown
            seconds = item.sleep_s * (item.retries + 1) + item.retry_s * item.retries
        elif item.kind == "group":
            seconds = item.sleep_s * len(item.members) * s.attempts
        else:
            seconds = item.sleep_s
        starts = s.attempts if item.kind == "work" and item.mode in ("fail", "flaky") else 1
        total += seconds * starts
    return total


def run_scenario(cluster: Cluster, scenario: Scenario, base: Path) -> Outcome:
    """Run ``scenario`` on ``cluster``'s servers; every process it started is gone after."""
    t0 = time.monotonic()
    base.mkdir(parents=True, exist_ok=True)
    (base / "scenario.json").write_text(scenario.to_json())
    run = Run(cluster, scenario, base)
    notes: list[str] = []
    nemesis = Nemesis(run)
    try:
        run.fleet.start_all()
        if run.relay is not None:
            run.relay.start()
        run.started = time.monotonic()
        publisher = Publisher(run)
        publisher.start()
        nemesis.start()
        publisher.join(scenario.publish_s + 120)
        nemesis.finish(timeout=max(f.at_s for f in scenario.faults) + 60 if scenario.faults else 1)
        run.heal()
        run.fleet.fill()
        if run.relay is not None:
            run.relay.ensure()
        keys = {run.key(i): i for i in scenario.items}
        beetle = {k for k in publisher.confirmed if keys[k].kind in checker.BEETLE_KINDS}
        deadline = time.monotonic() + drain_deadline_s(scenario)
        trace = checker.read_trace(run.trace)
        wanted = checker.awaited(beetle, keys, trace)
        while run.resolved(trace, wanted) != wanted and time.monotonic() < deadline:
            time.sleep(1)
            trace = checker.read_trace(run.trace)
            wanted = checker.awaited(beetle, keys, trace)
        unresolved = wanted - run.resolved(trace, wanted)
        time.sleep(scenario.settings.timeout_s + 3)  # a late second outcome shows up
        if run.relay is not None:
            run.relay.stop()
        run.fleet.stop()
        from kombu_beetle.trace import flush_all

        flush_all()
        run.heal()
        dead, left = _inspect(run)
        evidence = checker.Evidence(
            confirmed=publisher.confirmed,
            rolled_back=publisher.rolled_back,
            destroyed={n for n in run.destroyed},
            keys=keys,
            trace=checker.read_trace(run.trace),
            ledger=read_dir(run.ledger),
            audit=naive.judge(naive.expand([run.trace])),
            dead_letters=dead,
            kills=nemesis.kills,
            redis_outages=nemesis.redis_outages,
            faults=nemesis.counts,
            effects=_effects(run.db_url),
            leftover=left,
            unresolved=unresolved,
        )
        violations = checker.judge(scenario, evidence)
        notes += publisher.errors[:5] + nemesis.errors
        (base / "verdict.json").write_text(
            json.dumps(
                {
                    "violations": [str(v) for v in violations],
                    **checker.summary(violations, scenario),
                    "nemesis": nemesis.describe(),
                    "publish_errors": publisher.errors,
                    "audit": evidence.audit.counts,
                },
                indent=1,
            )
        )
        return Outcome(
            scenario,
            violations,
            nemesis.counts,
            len(publisher.confirmed),
            round(time.monotonic() - t0, 1),
            base,
            notes,
        )
    finally:
        nemesis.stopping.set()
        for proc in nemesis.helpers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if run.relay is not None:
            run.relay.kill()
        if run.destroyed:
            cluster.heal()  # a new node where the destroyed one was, for the next scenario
        for worker in run.fleet.every:
            worker.kill()
