"""Beetle against what a team would pick instead: plain Celery on a quorum-queue cluster.

For "no confirmed task lost when a broker machine dies", the usual choice is plain Celery on
a three-node RabbitMQ cluster with quorum queues (``task_default_queue_type = "quorum"``).
Side by side in one run, rounds interleaved (the order rotates each round), one worker
(prefork ``-c 2``, default prefetch), confirmed publishing, queues filled before the worker
starts:

- **plain**: plain Celery, one classic-queue broker (no redundancy: the baseline);
- **quorum**: plain Celery on a local three-node cluster, quorum queues (the peer);
- **floor**: a plain task published to two brokers, the second copy dropped in the
  transport from a memory set, no Redis (the least any two-copy design costs);
- **claimed**: the floor, and one Redis round trip before each body (``SET NX`` from the
  pool process, no completion stored): the most tasks/s a design that claims before the
  body reaches on this machine (its CPU is no such bound: a call from the pool process
  costs more than the gate's pipelined one);
- **stored**: ``claimed``, and the outcome stored before the task returns (a second round
  trip from the pool process): the least a design that keeps every outcome does;
- **beetle**: a BeetleTask on ``beetle://`` over two brokers, deduplicated in Redis.

Printed per body (``--bodies``, ms): tasks/s (first run to last), publish/s (one confirmed
publisher), and CPU per task by process group, publishing and consuming; the ratios against
plain and the quorum cluster, and beetle's distance from the floor group by group. Then the
countdown probe (:mod:`benchmarks._peer_probes`), Redis commands per BeetleTask, and with
``--latency-runs N`` the publish-to-body p99 at half of plain's peak in N runs.
``--latency-ms`` puts a proxy that holds every byte that long each way in front of every
broker and Redis (clients' links only: the cluster's own links between its nodes stay
local, which favours the cluster).

Usage::

    python -m benchmarks.bench_peers [--tasks 3000] [--rounds 3] [--bodies 0,5]
        [--latency-ms 0.5] [--latency-runs 3] [--no-probe] [--profile DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _peer_probes as probes  # noqa: E402
from benchmarks import _profile, bench_exactly_once  # noqa: E402
from benchmarks._cpu import CpuMeter, listener_pid  # noqa: E402

KINDS = ("plain", "quorum", "floor", "claimed", "stored", "beetle")
LABELS = {
    "plain": "plain Celery, 1 classic broker",
    "quorum": "plain Celery, 3-node quorum",
    "floor": "2 copies, no dedup (floor)",
    "claimed": "floor + a claim before each body",
    "stored": "floor + a claim + its outcome",
    "beetle": "BeetleTask, 2 brokers",
}


@dataclass
class Kind:
    """One contender: where it publishes, what the worker consumes, which servers it uses."""

    name: str
    url: str
    task: str
    queue_type: str = "classic"
    twice: bool = False
    env: dict[str, str] = field(default_factory=dict)
    servers: dict[str, list[int]] = field(default_factory=dict)

    def publish_url(self, queue: str) -> str:
        return f"{self.url}?redundant_queues={queue}" if self.twice else self.url


@dataclass
class Figures:
    """What the rounds measured of one kind at one body: lists, one value per round."""

    rate: list[float] = field(default_factory=list)
    publish: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)  # consuming, µs/task by group
    pub_cpu: dict[str, list[float]] = field(default_factory=dict)  # publishing


def fill(kind: Kind, queue: str, tasks: int, redis_url: str, figures: Figures) -> list[str]:
    """Publish ``tasks`` confirmed tasks one after another; record publish/s and the CPU
    of the publisher (this process) and the servers while it ran."""
    client = probes.client_app(kind.publish_url(queue), redis_url, kind.queue_type)
    task = probes.bench_task(client, kind.task)
    meter = CpuMeter(kind.servers)
    ids = []
    with client.producer_or_acquire() as producer:
        task.apply_async((-1.0,), queue=queue, producer=producer)  # declares
        meter.start()
        began, cpu = time.perf_counter(), time.process_time()
        for i in range(tasks):
            ids.append(task.apply_async((i,), queue=queue, producer=producer).id)
        elapsed, own = time.perf_counter() - began, time.process_time() - cpu
        used = meter.stop()
    client.close()
    figures.publish.append(tasks / elapsed)
    for group, seconds in {"publisher": own, **used}.items():
        figures.pub_cpu.setdefault(group, []).append(seconds * 1e6 / tasks)
    return ids


def drain(
    kind: Kind, queue: str, tasks: int, redis_url: str, tmp: Path, figures: Figures, **kw: Any
) -> None:
    """Start a worker on the filled queue (the declaring task is one more run)."""
    rate, _ = bench_exactly_once.run_worker(
        kind.url, redis_url, queue, tasks + 1, "prefork", 2, tmp,
        extra_env=kind.env, servers=kind.servers, cpu_by=figures.cpu, **kw,
    )  # fmt: skip
    figures.rate.append(rate)


def rounds(
    kinds: dict[str, Kind], opts: argparse.Namespace, redis_url: str, tmp: Path
) -> dict[float, dict[str, Figures]]:
    results: dict[float, dict[str, Figures]] = {}
    for n in range(opts.rounds):
        for body in opts.bodies:
            bench_exactly_once.BODY_MS = body
            chosen = [k for k in KINDS if k in opts.kinds]
            order = chosen[n % len(chosen) :] + chosen[: n % len(chosen)]
            line = []
            for name in order:
                kind, figures = (
                    kinds[name],
                    results.setdefault(body, {}).setdefault(name, Figures()),
                )
                queue = f"peers-{name}-{body:g}-{n}"
                fill(kind, queue, opts.tasks, redis_url, figures)
                last = n == opts.rounds - 1 and opts.profile is not None
                profile = opts.profile / f"{name}-{body:g}.txt" if last else None
                drain(kind, queue, opts.tasks, redis_url, tmp, figures, profile=profile)
                line.append(f"{name} {figures.rate[-1]:5.0f}/s")
            print(f"  round {n + 1}, body {body:g} ms: " + ", ".join(line), flush=True)
    return results


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _spread(values: list[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}" if len(values) > 1 else ""


CONSUME = ("worker", "brokers", "redis", "links")
PUBLISH = ("publisher", "brokers", "redis", "links")


def totals(figures: Figures) -> tuple[float, float]:
    """Median CPU µs per task consuming, and publishing plus consuming; without the slow
    links' proxies, which stand in for a network that costs the machines no CPU."""
    consume = sum(_med(figures.cpu[g]) for g in CONSUME[:-1] if g in figures.cpu)
    publish = sum(_med(figures.pub_cpu[g]) for g in PUBLISH[:-1] if g in figures.pub_cpu)
    return consume, consume + publish


def round_totals(figures: Figures) -> list[float]:
    """Each round's CPU µs per task, publishing plus consuming (without the proxies)."""
    return [
        sum(figures.cpu[g][i] for g in CONSUME[:-1] if g in figures.cpu)
        + sum(figures.pub_cpu[g][i] for g in PUBLISH[:-1] if g in figures.pub_cpu)
        for i in range(len(figures.rate))
    ]


def report(results: dict[float, dict[str, Figures]], latency_ms: float) -> None:
    for body, by_kind in results.items():
        print(f"\nbody {body:g} ms{f', {latency_ms:g} ms added each way' if latency_ms else ''}"
              " (medians over the rounds; min-max beside tasks/s)")  # fmt: skip
        groups = [g for g in CONSUME if any(g in f.cpu for f in by_kind.values())]
        pub = [g for g in PUBLISH if any(g in f.pub_cpu for f in by_kind.values())]
        print(
            f"  {'':32}{'tasks/s':>8}{'spread':>11}{'publish/s':>10}  CPU µs/task consuming: "
            + "".join(f"{g:>9}" for g in groups)
            + "    publishing: " + "".join(f"{g:>10}" for g in pub)
            + f"{'consume':>9}{'all':>7}{'spread':>11}"
        )  # fmt: skip
        for name, f in by_kind.items():
            consume, whole = totals(f)
            print(
                f"  {LABELS[name]:32}{_med(f.rate):8.0f}{_spread(f.rate):>11}"
                f"{_med(f.publish):10.0f}  {'':22}"
                + "".join(f"{_med(f.cpu.get(g, [])):9.0f}" for g in groups)
                + f"    {'':12}" + "".join(f"{_med(f.pub_cpu.get(g, [])):10.0f}" for g in pub)
                + f"{consume:9.0f}{whole:7.0f}{_spread(round_totals(f)):>11}"
            )  # fmt: skip
        split = [
            f"{name} {_med(f.cpu['main']):.0f} + {_med(f.cpu['worker']) - _med(f.cpu['main']):.0f}"
            for name, f in by_kind.items()
            if "main" in f.cpu
        ]
        print("  worker µs/task, main process + pool processes: " + "; ".join(split))
        targets(body, by_kind, latency_ms)


def targets(body: float, by_kind: dict[str, Figures], latency_ms: float) -> None:
    plain, quorum, floor, claimed, stored, beetle = (by_kind.get(k) for k in KINDS)
    if not (plain and quorum and beetle):
        return
    rate = _med(beetle.rate)
    _, b_all = totals(beetle)
    b_consume, _ = totals(beetle)
    q_consume, q_all = totals(quorum)
    p_consume, p_all = totals(plain)
    print(
        f"  beetle/quorum: tasks/s {rate / _med(quorum.rate):.2f} "
        f"(target >= {0.95 if latency_ms else 1.0}), CPU/task {b_all / q_all:.2f} "
        f"(consuming only {b_consume / q_consume:.2f}; target <= 0.7)"
    )
    bounds = {
        "floor + a claim before each body (the most tasks/s such a design reaches)": claimed,
        "floor + a claim + its outcome stored (the least a design keeping outcomes does)":
            stored,
    }  # fmt: skip
    for label, bound_kind in bounds.items():
        if bound_kind is None:
            continue
        c_rate, c_all = _med(bound_kind.rate), totals(bound_kind)[1]
        print(
            f"  {label}: tasks/s {c_rate / _med(quorum.rate):.2f} of quorum's, beetle's "
            f"{rate / c_rate:.2f} of it; its CPU/task {c_all / q_all:.2f} of quorum's, "
            f"{c_all / p_all:.2f} of plain's"
        )
    bound = 1.5 if body == 0 else 1.6
    print(
        f"  beetle/plain: tasks/s {rate / _med(plain.rate):.2f}, CPU/task {b_all / p_all:.2f} "
        f"(consuming only {b_consume / p_consume:.2f}; target <= {bound})"
    )
    if floor:
        f_consume, f_all = totals(floor)
        print(
            f"  floor/plain CPU/task {f_all / p_all:.2f} (consuming {f_consume / p_consume:.2f});"
            f" beetle/floor {b_all / f_all:.2f}; beetle - floor, µs/task by group:"
        )
        gaps = [
            f"{g} {_med(beetle.cpu.get(g, [])) - _med(floor.cpu.get(g, [])):+.0f}"
            for g in CONSUME if g in beetle.cpu
        ] + [
            f"publish {g} {_med(beetle.pub_cpu[g]) - _med(floor.pub_cpu.get(g, [])):+.0f}"
            for g in PUBLISH if g in beetle.pub_cpu
        ]  # fmt: skip
        print("    " + ", ".join(gaps))


@contextlib.contextmanager
def contenders(opts: argparse.Namespace, tmp: Path) -> Iterator[tuple[dict[str, Kind], Any]]:
    """Start two brokers, a cluster and Redis (and with ``--latency-ms`` the proxies in front
    of them); yield the kinds and the Redis server."""
    from benchmarks._cluster import rabbit_cluster
    from benchmarks._links import slow_links
    from benchmarks._nodes import rabbit_ports
    from celery_beetle.testing.redis_server import RedisServer

    redis = RedisServer(tmp / "redis")
    redis.start()
    try:
        with rabbit_ports(2) as ports, rabbit_cluster(3) as cluster:
            real = {"pair": ports, "cluster": [node.port for node in cluster]}
            pids = {
                "pair": [p for p in map(listener_pid, ports) if p is not None],
                "cluster": [node.pid for node in cluster if node.pid],
                "redis": [redis.pid] if redis.pid else [],
            }
            links: Any = (
                slow_links(opts.latency_ms, [*ports, *real["cluster"], redis.port])
                if opts.latency_ms
                else contextlib.nullcontext(({}, None))
            )
            with links as (via, proxies_pid):

                def at(port: int) -> str:
                    return f"127.0.0.1:{via.get(port, port)}"

                extra = {"links": [proxies_pid]} if proxies_pid else {}
                redis_url = f"redis://{at(redis.port)}/0"
                pair = f"beetle://guest:guest@{at(ports[0])},{at(ports[1])}//"
                plain = f"pyamqp://guest:guest@{at(ports[0])}//"
                quorum = ";".join(f"pyamqp://guest:guest@{at(p)}//" for p in real["cluster"])
                two = {"brokers": pids["pair"], "redis": pids["redis"], **extra}
                kinds = {
                    "plain": Kind("plain", plain, "bench.plain",
                                  servers={"brokers": pids["pair"][:1], "redis": pids["redis"],
                                           **extra}),
                    "quorum": Kind("quorum", quorum, "bench.plain", queue_type="quorum",
                                   env={"BENCH_QUEUE_TYPE": "quorum"},
                                   servers={"brokers": pids["cluster"], "redis": pids["redis"],
                                            **extra}),
                    "floor": Kind("floor", pair, "bench.plain", twice=True,
                                  env={"BENCH_TRANSPORT_DEDUP": "1"}, servers=two),
                    "claimed": Kind("claimed", pair, "bench.claimed", twice=True,
                                    env={"BENCH_TRANSPORT_DEDUP": "1"}, servers=two),
                    "stored": Kind("stored", pair, "bench.stored", twice=True,
                                   env={"BENCH_TRANSPORT_DEDUP": "1"}, servers=two),
                    "beetle": Kind("beetle", pair, "bench.beetle", servers=two),
                }  # fmt: skip
                print(
                    f"{opts.tasks} tasks x {opts.rounds} rounds, bodies {opts.bodies} ms, "
                    f"prefork -c 2, brokers {ports}, cluster {real['cluster']}, "
                    f"Redis {redis.port}"
                    + (f", {opts.latency_ms:g} ms added each way by proxies" if via else ""),
                    flush=True,
                )
                yield kinds, (redis, redis_url)
    finally:
        redis.kill()


def probe(kinds: dict[str, Kind], redis_url: str, tmp: Path) -> None:
    print(
        f"\ncountdown probe ({probes.COUNTDOWNS} tasks with a {probes.COUNTDOWN_S:g} s "
        f"countdown, then {probes.DUE} due now; one worker, prefork -c 2):"
    )
    for name in ("plain", "quorum", "beetle"):
        kind = kinds[name]
        before, quick, last = probes.countdown_probe(
            kind.url, redis_url, kind.task, kind.queue_type, tmp
        )
        print(
            f"  {LABELS[name]:32} {before:2} of {probes.DUE} ran before the countdowns came "
            f"due, {quick:2} within 0.5 s (the last after {last:.2f} s)",
            flush=True,
        )


def redis_trips(kind: Kind, redis: Any, redis_url: str, tasks: int, tmp: Path) -> None:
    """Commands per BeetleTask (INFO commandstats deltas) and, under MONITOR, the client
    commands naming a task before its body ran (empty bodies): from a filled queue (the
    pool always busy) and paced at 50 tasks/s (the pool mostly idle)."""
    bench_exactly_once.BODY_MS = 0
    for how in ("filled", "paced"):
        queue = f"peers-trips-{how}-{time.monotonic_ns()}"
        out = tmp / f"{queue}.out"
        monitor = probes.RedisMonitor(redis.port, tmp / f"{queue}.monitor")
        try:
            with redis.client() as client:
                before = bench_exactly_once.commandstats(client)
            if how == "filled":
                ids = fill(kind, queue, tasks, redis_url, Figures())
                drain(kind, queue, tasks, redis_url, tmp, Figures())
            else:
                ids = probes.paced(kind.url, redis_url, kind.task, queue, tasks, 50.0, out)
            with redis.client() as client:
                after = bench_exactly_once.commandstats(client)
        finally:
            monitor.stop()
        calls = {k: (after.get(k, 0) - before.get(k, 0)) / tasks for k in after}
        calls = {k: round(v, 2) for k, v in calls.items() if v >= 0.01 and k != "info"}
        seen = probes.trips_before_body(monitor.out, ids, out)
        print(
            f"\nRedis per BeetleTask, {how} ({tasks} tasks): INFO commandstats (scripts' "
            f"commands too) {calls}\n  client commands naming a task (MONITOR, "
            f"{seen.get('tasks', 0)} tasks): before its body "
            f"{seen.get('before_mean', math.nan):.2f}"
            f" (max {seen.get('before_max', 0)}), after {seen.get('after_mean', math.nan):.2f} "
            f"(max {seen.get('after_max', 0)}); target <= 1 before the body"
        )


def latency_runs(kinds: dict[str, Kind], redis_url: str, runs: int, tasks: int, tmp: Path) -> None:
    """p99 publish-to-body of BeetleTask and plain at half of plain's peak (publishing
    meanwhile), ``runs`` times; target: beetle's p99 <= 1.3x plain's in each run. Beside
    them the floor with a claim before each body, at the same rate: what one round trip to
    Redis per task allows."""
    from benchmarks.bench_latency import latency

    plain, claimed, beetle = kinds["plain"], kinds["claimed"], kinds["beetle"]
    print(f"\npublish-to-body at 50 % of plain's peak ({tasks} tasks each, empty bodies):")
    for n in range(runs):
        peak = latency(plain.url, redis_url, plain.task, math.inf, tasks, tmp)[3]
        rate = peak / 2
        p = latency(plain.url, redis_url, plain.task, rate, tasks, tmp)
        b = latency(beetle.url, redis_url, beetle.task, rate, tasks, tmp)
        c = latency(claimed.url, redis_url, claimed.task, rate, tasks, tmp, twice=True)
        print(
            f"  run {n + 1}: plain's peak {peak:.0f}/s, at {rate:.0f}/s: plain p50 {p[0]:.1f} "
            f"ms p99 {p[1]:.1f} ms; BeetleTask p50 {b[0]:.1f} ms p99 {b[1]:.1f} ms (sent "
            f"{b[2]:.0f}/s, served {b[3]:.0f}/s); p99 beetle/plain {b[1] / p[1]:.2f} "
            f"(target <= 1.3); floor + a claim p99 {c[1]:.1f} ms (served {c[3]:.0f}/s), "
            f"against plain's {c[1] / p[1]:.2f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help="which to time")
    parser.add_argument("--bodies", default="0,5", help="task bodies to time, ms (a sleep)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added each way per link")
    parser.add_argument("--latency-runs", type=int, default=0, help="p99 runs (target 4)")
    parser.add_argument("--trip-tasks", type=int, default=300, help="MONITOR run (0: none)")
    parser.add_argument("--no-probe", action="store_true", help="skip the countdown probe")
    parser.add_argument("--profile", type=Path, help="py-spy each kind's worker, last round")
    opts = parser.parse_args()
    opts.bodies = [float(b) for b in opts.bodies.split(",")]
    opts.kinds = opts.kinds.split(",")
    if opts.profile:
        opts.profile.mkdir(parents=True, exist_ok=True)
        bench_exactly_once.PROFILE_POOL = True
    tmp = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    with contenders(opts, tmp) as (kinds, (redis, redis_url)):
        results = rounds(kinds, opts, redis_url, tmp)
        report(results, opts.latency_ms)
        if opts.trip_tasks:
            redis_trips(kinds["beetle"], redis, redis_url, opts.trip_tasks, tmp)
        if not opts.no_probe:
            probe(kinds, redis_url, tmp)
        if opts.latency_runs:
            latency_runs(kinds, redis_url, opts.latency_runs, opts.tasks, tmp)
    if opts.profile:
        for path in sorted(opts.profile.glob("*.txt")):
            print(f"\npy-spy, worker and pool processes, {path.stem}:")
            for line in _profile.summary(path):
                print(f"  {line}")
    print(
        "\nOne machine runs every process here: the cluster's three nodes share the cores "
        "that a real cluster spreads over three machines, so tasks/s favours fewer processes;"
        " CPU per task, by process group, is the figure that carries over to real machines."
    )


if __name__ == "__main__":
    main()
