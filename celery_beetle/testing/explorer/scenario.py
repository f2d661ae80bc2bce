"""A scenario: the workload, the settings and the faults of one run, drawn from a seed.

Everything random about a run is decided here, before anything starts, by one
``random.Random(seed)``: the same seed gives the same scenario (the servers' own timing still
varies), and a failure is replayed with ``scripts/explore --seed S``. The draw leans towards
what users run (``attempts=1``, the default prefetch, ``acks_late`` as BeetleTask sets it)
and towards the moments where features meet (a worker killed while its pool holds claimed
deliveries, a migration while countdown tasks are held, a kill right after an inbox commit),
because that is where the bugs found so far were.

The draw grew in versions, each from a random stream of its own (``Random(seed)``, then
``Random(f"{seed}/2")``, ... ``Random(f"{seed}/6")``), so that a later
version only *adds* items and faults: a seed keeps the settings, messages and faults an
earlier version gave it (``tests/unit/test_explorer.py`` pins seeds 1000, 1004, 3022 and
5000). The third version adds ``self.retry`` bodies, groups, outbox enqueues (committed and
rolled back, some with an ordering key) behind a ``beetle relay``, a dedup scope shared by
two queues, and the faults of :data:`THIRD_FAULTS`. The fourth adds chains of three or four
links (one may fail: the links after it never run), ``self.retry`` without a countdown (the
task's ``default_retry_delay``), bodies that retry once more than their ``max_retries`` and,
in a quarter of the scenarios, chords (their workers then have a result backend). The
fifth adds RabbitMQ 4's limits (:attr:`Settings.rabbit4`: quorum queues, an operator policy
``delivery-limit`` of 20 on every node, sometimes a lowered ``consumer_timeout``) and
``queues_bound``: ``beetle queues apply`` of a TTL or a max-length small enough to expire
or drop the run's messages for a while (each must end in ``<queue>.dead`` with RabbitMQ's
reason, never silently gone). The sixth adds a Sentinel-managed Redis
(a master killed and its replica promoted, with and without ``beetle_redis_wait_replicas``;
a replica frozen while writes wait for it), a worker with tracing off, and a broker replaced
by an empty node, and a worker of the previous release upgraded during the run.

A scenario is a plain dataclass: printable (:meth:`Scenario.describe`), serialisable
(:meth:`Scenario.to_json`), and reducible (:mod:`.shrink` drops items, faults and workers
from it and runs what is left).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = [
    "BAD_INPUTS",
    "BODY_MODES",
    "CONSUMER_TIMEOUT_MS",
    "DELIVERY_LIMIT",
    "FAULT_KINDS",
    "FIFTH_FAULTS",
    "NETWORK_FAULTS",
    "RETRY_DELAY_S",
    "SECOND_QUEUE",
    "SIXTH_FAULTS",
    "THIRD_FAULTS",
    "Fault",
    "Item",
    "Scenario",
    "Settings",
    "draw",
]

#: what a ``ex.work`` body does (see :mod:`.app`); the modes' rules are in :mod:`.allowed`
BODY_MODES = ("ok", "long", "fail", "flaky", "fatal", "overrun")
#: messages a publisher should never write, published raw to one broker (:mod:`.runner`)
BAD_INPUTS = ("undecodable", "invalid_header", "no_message_id")
#: every fault the nemesis (:mod:`.faults`) knows, with its weight in the draw
FAULT_KINDS: dict[str, int] = {
    "worker_kill": 30,
    "worker_term": 12,
    "pool_kill": 8,
    "broker_kill": 10,
    "broker_freeze": 8,
    "redis_kill": 8,
    "redis_refuse": 5,
    "script_flush": 4,
    "migrate": 8,
    "replay": 5,
}
#: faults of the draw's second version (its own stream, so earlier seeds keep their faults)
NETWORK_FAULTS: dict[str, int] = {
    "partition": 4,
    "stall": 3,
    "held_replies": 2,
    "redis_partition": 3,
    "redis_held_replies": 2,
}

#: faults of the draw's third version (its own stream; each only where it applies)
THIRD_FAULTS = ("relay_kill", "broker_destroy", "queues_apply", "latency")
#: faults of the draw's fifth version (its own stream)
FIFTH_FAULTS = ("queues_bound",)
#: faults of the draw's sixth version (its own stream)
SIXTH_FAULTS = ("redis_failover", "replica_lag", "broker_replace", "worker_upgrade")
#: RabbitMQ's ``consumer_timeout`` by default (30 min), put back after a scenario lowered it
CONSUMER_TIMEOUT_MS = 1_800_000
#: the quorum queues' ``delivery-limit`` RabbitMQ 4 sets by default
DELIVERY_LIMIT = 20
#: the queue that shares the main queue's dedup scope (``Settings.shared_scope``)
SECOND_QUEUE = "explore2"
#: ``ex.retry``'s ``default_retry_delay``: the wait of a ``self.retry()`` without a countdown
RETRY_DELAY_S = 1.0


@dataclass(frozen=True)
class Settings:
    """What the workers and the task are configured with (one set per scenario)."""

    attempts: int = 1
    exceptions: int = 0
    acks_late: bool | None = None  # None: as BeetleTask sets it
    timeout_s: float = 6.0  # the lease
    prefetch_multiplier: int = 4
    pool: str = "prefork"
    concurrency: int = 2
    brokers: int = 2
    workers: int = 1
    inbox: bool = False  # a PostgreSQL and ``ex.inbox`` tasks
    #: (third version) outbox enqueues, a PostgreSQL and a ``beetle relay`` process
    outbox: bool = False
    #: (third version) workers also consume SECOND_QUEUE, mapped to the main queue's scope
    shared_scope: bool = False
    #: (fifth version) RabbitMQ 4's limits: quorum queues, an operator policy
    #: ``delivery-limit`` of DELIVERY_LIMIT on every node
    rabbit4: bool = False
    #: (fifth version) the nodes' ``consumer_timeout`` for the scenario (0: the default,
    #: CONSUMER_TIMEOUT_MS); RabbitMQ 3.10 checks it once a minute
    consumer_timeout_ms: int = 0
    #: (sixth version) the dedup store is a Sentinel-managed master with one replica
    sentinel: bool = False
    #: (sixth version) ``beetle_redis_wait_replicas`` (with ``sentinel``)
    wait_replicas: int = 0
    #: (sixth version) worker slots started with tracing off (the first ``untraced``)
    untraced: int = 0
    #: (sixth version) the last worker slot runs the previous release until upgraded
    previous: bool = False

    def task_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "attempts": self.attempts,
            "exceptions": self.exceptions,
            "timeout": self.timeout_s,
            "retry_delay": 0.2,
            "max_delay": 1,
        }
        if self.acks_late is not None:
            options["acks_late"] = self.acks_late
        return options


@dataclass(frozen=True)
class Item:
    """One message: ``kind`` ``work`` (a BeetleTask), ``inbox`` (a BeetleTask committing its
    effect behind the inbox), ``plain`` (a plain Celery task, one broker) or ``bad`` (an
    ``ex.work`` message with a defect, ``mode`` one of BAD_INPUTS) or ``chain`` (two
    ``ex.work`` tasks in a chain, the first with body ``mode``, the second ``ok``).

    Third version: ``retry`` (an ``ex.retry`` body that calls ``self.retry`` ``retries``
    times, ``retry_s`` apart, then returns; fourth version: ``retry_s`` 0 calls it without a
    countdown, and ``mode`` ``past_max`` calls it once more, past ``max_retries``: Celery
    raises ``MaxRetriesExceededError`` in the body), ``group`` (a group of ``ex.work`` tasks, one
    per mode in ``members``), ``outbox`` (an ``ok`` ``ex.work`` enqueued through the outbox
    in a transaction that ``mode`` ``commit``s or ``rollback``s, with ``ordering_key`` when
    not empty, due after ``countdown_s``), ``scoped`` (one ``ok`` ``ex.work`` published to
    the main queue and to SECOND_QUEUE under one task id: one message of one scope).
    Fourth version: a ``chain`` with ``members`` has a link per member after the first
    (``mode``), each with the body the member names; a ``chord`` is a header of ``ex.work``
    tasks, one per mode in ``members``, and an ``ex.join`` body that checks it got every
    header task's result."""

    index: int
    kind: str
    mode: str = "ok"  # for ``work``: one of BODY_MODES
    sleep_s: float = 0.05
    at_s: float = 0.0  # when it is published, from the scenario's start
    countdown_s: float = 0.0
    members: tuple[str, ...] = ()
    retries: int = 0
    retry_s: float = 0.0
    ordering_key: str = ""


@dataclass(frozen=True)
class Fault:
    """One fault at ``at_s``: ``target`` is a worker or broker index (taken modulo what
    exists at that moment), ``duration_s`` how long before it heals (a restart, a resume);
    ``delay_ms`` the one-way delay a ``latency`` fault adds. A ``queues_bound`` (fifth
    version) sets, for ``duration_s``, a TTL of ``bound`` ms (``target`` 0) or a max-length
    of ``bound`` messages (``target`` 1) on the run's queues. A ``redis_failover`` (sixth
    version) first cuts the replica off for ``lag_s`` while the master acknowledges writes
    (what it then lacks is lost with the master)."""

    at_s: float
    kind: str
    target: int = 0
    duration_s: float = 1.0
    delay_ms: int = 0
    bound: int = 0
    lag_s: float = 0.0


@dataclass(frozen=True)
class Scenario:
    seed: int
    settings: Settings
    items: tuple[Item, ...]
    faults: tuple[Fault, ...] = field(default=())

    @property
    def chords(self) -> bool:
        """Whether it publishes chords: its workers then need a result backend."""
        return any(i.kind == "chord" for i in self.items)

    @property
    def publish_s(self) -> float:
        return max((i.at_s for i in self.items), default=0.0)

    def describe(self) -> str:
        s = self.settings
        kinds: dict[str, int] = {}
        for item in self.items:
            name = item.kind if item.kind not in ("work", "outbox") else f"{item.kind}:{item.mode}"
            kinds[name] = kinds.get(name, 0) + 1
        countdowns = sum(1 for i in self.items if i.countdown_s)
        faults = ", ".join(f"{f.kind}@{f.at_s:.1f}s" for f in self.faults) or "none"
        return (
            f"seed {self.seed}: attempts={s.attempts} exceptions={s.exceptions} "
            f"acks_late={s.acks_late} timeout={s.timeout_s}s prefetch={s.prefetch_multiplier} "
            f"pool={s.pool}x{s.concurrency} brokers={s.brokers} workers={s.workers} "
            f"inbox={s.inbox} outbox={s.outbox} shared_scope={s.shared_scope}"
            f"{_rabbit4(s)}{_sixth(s)}; "
            f"{len(self.items)} messages {kinds} ({countdowns} countdown); "
            f"faults: {faults}"
        )

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        data = json.loads(text)
        return cls(
            seed=data["seed"],
            settings=Settings(**data["settings"]),
            items=tuple(
                Item(**{**i, "members": tuple(i.get("members", ()))}) for i in data["items"]
            ),
            faults=tuple(Fault(**f) for f in data["faults"]),
        )

    def but(self, **changes: Any) -> Scenario:
        return replace(self, **changes)


def _rabbit4(s: Settings) -> str:
    if not s.rabbit4:
        return ""
    timeout = f" consumer_timeout={s.consumer_timeout_ms}ms" if s.consumer_timeout_ms else ""
    return f" rabbit4(quorum, delivery-limit={DELIVERY_LIMIT}{timeout})"


def _sixth(s: Settings) -> str:
    sentinel = f" sentinel(wait_replicas={s.wait_replicas})" if s.sentinel else ""
    untraced = f" untraced={s.untraced}" if s.untraced else ""
    return sentinel + untraced + (" previous-release" if s.previous else "")


def _settings(rng: random.Random) -> Settings:
    attempts = rng.choices([1, 2, 3], weights=[50, 25, 25])[0]
    pool = rng.choices(["prefork", "threads", "solo"], weights=[50, 30, 20])[0]
    concurrency = {"prefork": rng.randint(1, 3), "threads": rng.randint(2, 4), "solo": 1}[pool]
    return Settings(
        attempts=attempts,
        exceptions=rng.randint(0, attempts - 1),
        acks_late=rng.choices([None, False, True], weights=[70, 20, 10])[0],
        timeout_s=rng.choice([4.0, 6.0, 10.0]),
        prefetch_multiplier=rng.choices([4, 1, 16], weights=[60, 20, 20])[0],
        pool=pool,
        concurrency=concurrency,
        brokers=rng.choice([2, 3]),
        workers=rng.choices([1, 2, 3], weights=[40, 40, 20])[0],
        inbox=rng.random() < 0.35,
    )


def _items(rng: random.Random, settings: Settings, publish_s: float) -> tuple[Item, ...]:
    count = rng.randint(20, 150)
    countdown_share = rng.choice([0.0, 0.1, 0.4])
    items = []
    for index in range(count):
        roll = rng.random()
        if settings.inbox and roll < 0.3:
            kind, mode = "inbox", "ok"
        elif roll > 0.93:
            kind, mode = "plain", "ok"
        else:
            kind = "work"
            mode = rng.choices(BODY_MODES, weights=[62, 8, 8, 10, 8, 4])[0]
        sleep_s = round(rng.choice([0.01, 0.05, 0.2, 0.6]) * rng.random() * 2, 3)
        countdown = 0.0
        if kind != "plain" and rng.random() < countdown_share:
            countdown = round(rng.uniform(2, 15), 1)
        items.append(
            Item(
                index=index,
                kind=kind,
                mode=mode,
                sleep_s=sleep_s,
                at_s=round(publish_s * index / count, 2),
                countdown_s=countdown,
            )
        )
    return tuple(items)


def _faults(rng: random.Random, settings: Settings, publish_s: float) -> tuple[Fault, ...]:
    kinds = [k for k in FAULT_KINDS if k != "pool_kill" or settings.pool == "prefork"]
    weights = [FAULT_KINDS[k] for k in kinds]
    faults = []
    for _ in range(rng.choices([0, 1, 2, 3, 4], weights=[10, 35, 30, 15, 10])[0]):
        kind = rng.choices(kinds, weights=weights)[0]
        at = round(rng.uniform(0.5, publish_s + 4), 1)
        faults.append(
            Fault(at, kind, target=rng.randint(0, 2), duration_s=round(rng.uniform(0.3, 4), 1))
        )
        if kind == "migrate" and rng.random() < 0.6:
            # the blue-green step after a migration: the workers restart
            then = rng.choice(["worker_term", "worker_kill"])
            faults.append(Fault(round(at + rng.uniform(2, 6), 1), then, rng.randint(0, 2), 1.0))
    return tuple(sorted(faults, key=lambda f: f.at_s))


def _bad_inputs(rng: random.Random, first: int, publish_s: float) -> tuple[Item, ...]:
    """A few messages with bad headers or bodies (added in the draw's second version, from a
    stream of their own: the first version's items and faults stay what they were)."""
    count = rng.choice([0, 0, 1, 3])
    return tuple(
        Item(first + n, "bad", rng.choice(BAD_INPUTS), 0.0, round(rng.uniform(0, publish_s), 2))
        for n in range(count)
    )


def _chains(rng: random.Random, first: int, publish_s: float) -> tuple[Item, ...]:
    """Chains of two ``ex.work`` tasks (the second published by the worker that ran the
    first); the first fails now and then, and then the second must never run."""
    return tuple(
        Item(
            first + n,
            "chain",
            rng.choices(["ok", "fatal"], weights=[80, 20])[0],
            round(rng.uniform(0.01, 0.3), 3),
            round(rng.uniform(0, publish_s), 2),
        )
        for n in range(rng.choice([0, 0, 2, 5]))
    )


def _network_faults(
    rng: random.Random, faults: tuple[Fault, ...], publish_s: float
) -> tuple[Fault, ...]:
    """A network fault through the proxies now and then (the draw's second version)."""
    if rng.random() >= 0.3:
        return faults
    kind = rng.choices(list(NETWORK_FAULTS), weights=list(NETWORK_FAULTS.values()))[0]
    fault = Fault(
        round(rng.uniform(0.5, publish_s + 4), 1),
        kind,
        rng.randint(0, 2),
        round(rng.uniform(0.5, 5), 1),
    )
    return tuple(sorted((*faults, fault), key=lambda f: f.at_s))


def draw(seed: int) -> Scenario:
    """The scenario of ``seed``: the same for the same seed, on any machine."""
    rng = random.Random(seed)
    settings = _settings(rng)
    publish_s = rng.uniform(4, 12)
    items = _items(rng, settings, publish_s)
    faults = _faults(rng, settings, publish_s)
    extra = random.Random(f"{seed}/2")
    faults = _network_faults(extra, faults, publish_s)
    more = _bad_inputs(extra, len(items), publish_s)
    more += _chains(extra, len(items) + len(more), publish_s)
    items = items + more
    third = random.Random(f"{seed}/3")
    settings = _third_settings(third, settings, faults)
    items += _third_items(third, settings, len(items), publish_s)
    faults = _third_faults(third, settings, faults, publish_s)
    items += _fourth_items(random.Random(f"{seed}/4"), len(items), publish_s)
    fifth = random.Random(f"{seed}/5")
    settings = _fifth_settings(fifth, settings, faults)
    faults = _fifth_faults(fifth, faults, publish_s)
    sixth = random.Random(f"{seed}/6")
    settings = _sixth_settings(sixth, settings, faults)
    faults = _sixth_faults(sixth, settings, faults, publish_s)
    settings, faults = _previous_release(sixth, settings, faults, publish_s)
    items = tuple(sorted(items, key=lambda i: i.at_s))
    return Scenario(seed, settings, items, faults)


def _third_settings(rng: random.Random, settings: Settings, faults: tuple[Fault, ...]) -> Settings:
    """The outbox (a relay, a PostgreSQL) now and then; a second queue sharing the scope,
    except with a migration (it moves one queue, and the second's declaration would then
    disagree with what a restarted worker declares)."""
    outbox = rng.random() < 0.3
    shared = rng.random() < 0.25 and not any(f.kind == "migrate" for f in faults)
    return replace(settings, outbox=outbox, shared_scope=shared)


def _third_items(
    rng: random.Random, settings: Settings, first: int, publish_s: float
) -> tuple[Item, ...]:
    items: list[Item] = []

    def add(kind: str, mode: str = "ok", **fields: Any) -> None:
        sleep_s = round(rng.uniform(0.01, 0.3), 3)
        at_s = round(rng.uniform(0, publish_s), 2)
        items.append(Item(first + len(items), kind, mode, sleep_s, at_s, **fields))

    for _ in range(rng.choice([0, 0, 2, 4])):
        add("retry", retries=rng.choice([1, 1, 2]), retry_s=round(rng.uniform(0.2, 3), 1))
    for _ in range(rng.choice([0, 0, 1, 3])):
        size = rng.randint(2, 4)
        modes = tuple(rng.choices(["ok", "flaky", "fatal", "fail"], [70, 10, 10, 10], k=size))
        add("group", members=modes)
    if settings.outbox:
        for _ in range(rng.randint(3, 12)):
            mode = rng.choices(["commit", "rollback"], weights=[70, 30])[0]
            key = rng.choice(["", "", "k0", "k1"])
            countdown = round(rng.uniform(1, 5), 1) if rng.random() < 0.15 else 0.0
            add("outbox", mode, ordering_key=key, countdown_s=countdown)
    if settings.shared_scope:
        for _ in range(rng.randint(2, 8)):
            add("scoped")
    return tuple(items)


def _third_faults(
    rng: random.Random, settings: Settings, faults: tuple[Fault, ...], publish_s: float
) -> tuple[Fault, ...]:
    """A relay kill (with the outbox); a broker destroyed for good (three brokers only: one
    is within N-2; not with a migration, which needs every broker's API); ``beetle queues
    apply`` of generous policies; latency added on one broker's link or Redis's."""
    added: list[Fault] = []

    def at(end: float) -> float:
        return round(rng.uniform(0.5, end), 1)

    if settings.outbox and rng.random() < 0.6:
        added.append(Fault(at(publish_s + 2), "relay_kill", 0, round(rng.uniform(0.3, 3), 1)))
    migrates = any(f.kind == "migrate" for f in faults)
    if settings.brokers == 3 and not migrates and rng.random() < 0.15:
        added.append(Fault(at(publish_s), "broker_destroy", rng.randint(0, 2), 0.0))
    if rng.random() < 0.1:
        added.append(Fault(at(publish_s + 2), "queues_apply", 0, 0.0))
    if rng.random() < 0.15:
        delay = rng.choice([20, 80, 200])
        target = rng.randint(0, settings.brokers)  # == brokers: Redis's link
        added.append(
            Fault(at(publish_s + 2), "latency", target, round(rng.uniform(1, 6), 1), delay)
        )
    return tuple(sorted((*faults, *added), key=lambda f: f.at_s))


def _fourth_items(rng: random.Random, first: int, publish_s: float) -> tuple[Item, ...]:
    """Chains of three or four links (the first ``ok`` or ``fatal``, then ``ok`` links, one
    of them ``fatal`` now and then); ``self.retry`` without a countdown; a body that retries
    once more than its ``max_retries``; now and then chords of 2-4 header tasks (one of
    them ``fatal`` now and then: the body never runs)."""
    items: list[Item] = []

    def add(kind: str, mode: str = "ok", **fields: Any) -> None:
        sleep_s = round(rng.uniform(0.01, 0.3), 3)
        at_s = round(rng.uniform(0, publish_s), 2)
        items.append(Item(first + len(items), kind, mode, sleep_s, at_s, **fields))

    for _ in range(rng.choice([0, 0, 1, 3])):
        links = rng.randint(2, 3)  # after the first
        members = tuple(rng.choices(["ok", "fatal"], weights=[85, 15], k=links))
        add("chain", rng.choices(["ok", "fatal"], weights=[85, 15])[0], members=members)
    for _ in range(rng.choice([0, 0, 1, 2])):
        add("retry", retries=rng.choice([1, 2]), retry_s=0.0)
    for _ in range(rng.choice([0, 0, 1, 2])):
        countdown = rng.choice([0.0, round(rng.uniform(0.2, 1.5), 1)])
        add("retry", "past_max", retries=rng.choice([0, 1, 2]), retry_s=countdown)
    if rng.random() < 0.25:  # a result backend for the scenario's workers (Scenario.chords)
        for _ in range(rng.randint(1, 3)):
            size = rng.randint(2, 4)
            add("chord", members=tuple(rng.choices(["ok", "fatal"], weights=[85, 15], k=size)))
    return tuple(items)


def _fifth_settings(rng: random.Random, settings: Settings, faults: tuple[Fault, ...]) -> Settings:
    """RabbitMQ 4's limits in a fifth of the scenarios (not with a migration, which moves a
    classic queue to a quorum one); in half of those a consumer timeout of 5 or 10 s, so
    that a countdown or a long body held unacked past it has its channel closed."""
    if rng.random() >= 0.2 or any(f.kind == "migrate" for f in faults):
        return settings
    timeout = rng.choice([5000, 10000]) if rng.random() < 0.5 else 0
    return replace(settings, rabbit4=True, consumer_timeout_ms=timeout)


def _fifth_faults(
    rng: random.Random, faults: tuple[Fault, ...], publish_s: float
) -> tuple[Fault, ...]:
    """Now and then ``queues_bound``: for a few seconds, a TTL of 0.2-2 s or a max-length of
    2-10 messages on the run's queues (the third version's generous bounds after)."""
    if rng.random() >= 0.15:
        return faults
    target = rng.randint(0, 1)
    bound = rng.choice([200, 1000, 2000]) if target == 0 else rng.choice([2, 5, 10])
    at = round(rng.uniform(0.5, publish_s), 1)
    fault = Fault(at, "queues_bound", target, round(rng.uniform(2, 8), 1), bound=bound)
    return tuple(sorted((*faults, fault), key=lambda f: f.at_s))


def _sixth_settings(rng: random.Random, settings: Settings, faults: tuple[Fault, ...]) -> Settings:
    """The sixth version's settings, from a stream of its own (``Random(f"{seed}/6")``),
    after the fifth, so a seed keeps everything the earlier versions gave it. The version:

    - in a fifth of the scenarios the dedup store is a **Sentinel-managed** master with one
      replica (:class:`~celery_beetle.testing.sentinel.SentinelSet`), with
      ``beetle_redis_wait_replicas = 1`` in half of those; then most draw a
      ``redis_failover`` (the master killed -9, the Sentinel promotes the replica, the old
      master comes back as a replica ``duration_s`` later; before the kill the replica may be
      cut off for ``lag_s`` while the master acknowledges writes: a lagging replica), and with
      ``wait_replicas`` half draw a ``replica_lag`` (the replica frozen, SIGSTOP, for
      ``duration_s``: every write waits for it and counts as not stored);
    - in a fifth of the scenarios with two or more workers, the first worker slot runs with
      **tracing off** (``untraced``): its messages are judged by the effect ledger and the
      brokers alone;
    - now and then a ``broker_replace``: a broker killed -9, its data wiped, and an empty node
      started on its port ``duration_s`` later (an operator recreates the vhost, as a
      definitions import would; the workers and publishers declare the queues again). Not
      with a migration, a broker destroyed for good or a queue bound (each reads what the
      node held);
    - in about one scenario in seven with two or more workers, the last worker slot runs the
      **previous release** (``previous``, :mod:`.previous`) until a ``worker_upgrade`` stops
      it warmly and starts the current code in its place (a rolling deploy's step).
    """
    sentinel = rng.random() < 0.2
    wait = 1 if sentinel and rng.random() < 0.5 else 0
    untraced = 1 if settings.workers >= 2 and rng.random() < 0.2 else 0
    return replace(settings, sentinel=sentinel, wait_replicas=wait, untraced=untraced)


def _sixth_faults(
    rng: random.Random, settings: Settings, faults: tuple[Fault, ...], publish_s: float
) -> tuple[Fault, ...]:
    """A failover (most Sentinel scenarios), a frozen replica (half of those that wait for
    it), a broker replaced by an empty node (about one scenario in eight, where it applies)."""
    added: list[Fault] = []

    def at(end: float) -> float:
        return round(rng.uniform(0.5, end), 1)

    if settings.sentinel and rng.random() < 0.8:
        lag = rng.choice([0.0, 0.0, 0.5, 1.5])
        added.append(
            Fault(at(publish_s + 2), "redis_failover", 0, round(rng.uniform(0.5, 4), 1), lag_s=lag)
        )
    if settings.wait_replicas and rng.random() < 0.5:
        added.append(Fault(at(publish_s + 2), "replica_lag", 0, round(rng.uniform(0.5, 4), 1)))
    kinds = {f.kind for f in faults}
    excluded = {"migrate", "broker_destroy", "queues_bound"}
    if not kinds & excluded and rng.random() < 0.12:
        target = rng.randint(0, settings.brokers - 1)
        # early: an empty node takes seconds to boot, and should still get publishes after
        when = at(max(1.0, publish_s - 6))
        added.append(Fault(when, "broker_replace", target, round(rng.uniform(0.5, 3), 1)))
    return tuple(sorted((*faults, *added), key=lambda f: f.at_s))


def _previous_release(
    rng: random.Random, settings: Settings, faults: tuple[Fault, ...], publish_s: float
) -> tuple[Settings, tuple[Fault, ...]]:
    """The last worker slot on the previous release, replaced by the current code during
    the run, in about one scenario in seven with two or more workers (drawn after the
    rest of the version, so a seed keeps what the version gave it before)."""
    if settings.workers < 2 or rng.random() >= 0.15:
        return settings, faults
    upgrade = Fault(round(rng.uniform(1, publish_s + 4), 1), "worker_upgrade", 0, 1.0)
    ordered = tuple(sorted((*faults, upgrade), key=lambda f: f.at_s))
    return replace(settings, previous=True), ordered
