"""Latency, and how throughput scales with the fleet.

**Latency**: publish-to-completion (the publisher stamps each task with the time it sent it;
the body writes when it ran) of a BeetleTask over ``beetle://`` and two brokers, at 50 % and
90 % of its own peak rate, beside a plain Celery task on ``pyamqp://`` and one broker at the
same rates, and beside the least any deduplicating task can do at those rates: the two-copy
path without dedup (a plain task on ``beetle://``, its second copy dropped in the transport
from a memory set) with one atomic claim in Redis (``SET NX``, a round trip from the pool
process) before the body. The peak is measured first with the publisher sending as fast as
it can meanwhile, as it shares the machine's cores (the peak drained from a full queue, with the
worker alone on them, is printed too). The publisher sends on a fixed schedule (open loop: a
slow worker does not slow it down), from two threads with a connection each, so that a
publisher waiting for its confirms does not lower the rate offered. Printed: p50, p99 and
p99 beetle/plain (target <= 1.3).

**Scaling** (``--scaling``): BeetleTask throughput with 2, 3 and 4 brokers and 1, 2 and 3
workers (each prefork ``-c 2``), beside plain Celery on one broker with the same workers;
queues filled first, the clock runs from the first run to the last. ``--plot`` draws it.

Usage::

    python -m benchmarks.bench_latency [--tasks 3000] [--rates 0.5,0.9] [--scaling]
        [--plot docs/_static/scaling.png] [--breakdown]

``--breakdown`` runs BeetleTask once more at the first rate with trace events on and prints
where its publish-to-completion goes: publish to the gate's delivery, the gate to the pool's
stored start, the start to the stored completion (p50, p99, and each stage's share of the
slowest 1 %).

Brokers from ``benchmarks/_nodes.py``, a throwaway Redis; the workers are
``benchmarks.bench_exactly_once``'s app.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from celery import Celery

import celery_beetle
from benchmarks._nodes import rabbit_ports
from benchmarks.bench_exactly_once import ROOT, fill, run_worker
from celery_beetle import BeetleTask
from celery_beetle.testing.redis_server import RedisServer

PLAIN, BEETLE, CLAIMED = "bench.plain", "bench.beetle", "bench.claimed"


@contextlib.contextmanager
def workers(
    broker: str,
    redis_url: str,
    queue: str,
    out: Path,
    count: int = 1,
    concurrency: int = 2,
    env: dict[str, str] | None = None,
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` workers of the benchmark app on ``queue``, writing their runs to ``out``."""
    env = {
        **os.environ,
        "BENCH_BROKER": broker,
        "BENCH_REDIS": redis_url,
        "BENCH_OUT": str(out),
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    out.touch()
    procs = []
    try:
        for n in range(count):
            args = [
                sys.executable, "-m", "celery", "-A", "benchmarks.bench_exactly_once", "worker",
                "-P", "prefork", "-c", str(concurrency), "-Q", queue, "-l", "warning",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"lat-{queue}-{n}-{os.getpid()}@%h",
            ]  # fmt: skip
            log = out.with_suffix(f".{n}.log").open("wb")
            procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)


def _runs(out: Path) -> list[tuple[float, float]]:
    """(when it ran, its argument) per line of a workers' ``out`` file."""
    rows = []
    for line in out.read_text().splitlines():
        ran, _, arg = line.partition(" ")
        if arg:
            rows.append((float(ran), float(arg)))
    return rows


def _wait_for(out: Path, count: int, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while len(out.read_text().splitlines()) < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise SystemExit(f"{out}: {len(_runs(out))} of {count} runs before the deadline")
        time.sleep(0.05)


def latency(
    broker: str,
    redis_url: str,
    task_name: str,
    rate: float,
    tasks: int,
    tmp: Path,
    trace_dir: Path | None = None,
    twice: bool = False,
    gate_claims: bool = False,
) -> tuple[float, float, float, float]:
    """p50 and p99 publish-to-completion (ms) at ``rate`` tasks/s (``inf``: as fast as the
    publishers can), the rate sent and the rate served (first publish to last run).
    With ``trace_dir``, publisher and worker write trace events there (:func:`breakdown`).
    ``twice``: a plain task published to both brokers of a ``beetle://`` URL, its second
    copy dropped in the transport from a memory set (the two-copy path with no dedup).
    ``twice`` with ``bench.claimed``: that path with one ``SET NX`` in Redis before the body.
    ``gate_claims``: the gate claims every delivery first (``beetle_claim_in_idle_pool``
    off), a pool process free or not."""
    label = int(rate) if rate < math.inf else "max"
    kind = "twice" if twice and task_name != CLAIMED else task_name.split(".")[1]
    queue = f"lat-{kind}-{label}-{time.monotonic_ns()}"
    out = tmp / f"{queue}.out"
    publish_url = f"{broker}?redundant_queues={queue}" if twice else broker
    client = Celery("bench_latency", broker=publish_url, set_as_current=False)
    client.conf.beetle_redis_url = redis_url
    if trace_dir is not None:  # the publisher traces through the transport's option
        client.conf.beetle_trace_dir = str(trace_dir)
        celery_beetle.install(client)
    base = BeetleTask if task_name == BEETLE else None

    def body(i: float) -> None: ...

    task = client.task(name=task_name, base=base, shared=False)(body)
    stats = tmp / f"{queue}.stats"
    env = {"BENCH_GC": "1", "BENCH_STATS": str(stats)}
    if GC_FREEZE:
        env["BENCH_GC_FREEZE"] = "1"
    if trace_dir is not None:
        env["BENCH_TRACE"] = str(trace_dir)
    if twice:
        env["BENCH_TRANSPORT_DEDUP"] = "1"
    if gate_claims:
        env["BENCH_CLAIM_IN_IDLE_POOL"] = "0"
    with workers(broker, redis_url, queue, out, env=env) as procs:
        with client.producer_or_acquire() as prod:
            task.apply_async((time.time(),), queue=queue, producer=prod)  # declares; warms up
        _wait_for(out, 1, 60, procs)
        start, began = time.monotonic(), time.time()

        def publish(first: int) -> None:
            """Every PUBLISHERS-th task from ``first``, each on its slot of the schedule."""
            with client.producer_pool.acquire(block=True) as prod:
                for i in range(first, tasks, PUBLISHERS):
                    delay = start + i / rate - time.monotonic() if rate < math.inf else 0
                    if delay > 0:
                        time.sleep(delay)
                    task.apply_async((time.time(),), queue=queue, producer=prod)

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(PUBLISHERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        sent_rate = tasks / (time.monotonic() - start)
        _wait_for(out, tasks + 1, 120, procs)
    client.close()
    runs = _runs(out)
    served_rate = tasks / (max(ran for ran, _ in runs) - began)
    waits = sorted(ran - sent for ran, sent in runs[1 + tasks // 10 :])  # warmed up
    GC_SEEN[kind] = _gc_line(stats)
    return _pct(waits, 0.5) * 1000, _pct(waits, 0.99) * 1000, sent_rate, served_rate


#: publishing threads, each with its own connection: a publisher waits for its confirms
#: (``beetle://``), so one thread alone cannot offer a rate near the worker's peak
PUBLISHERS = 2
#: ``--gc-freeze``: the workers freeze their start-up objects out of the collector
GC_FREEZE = False
#: the last run's garbage collections in the worker's main process, by the run's kind
GC_SEEN: dict[str, str] = {}


def _gc_line(stats: Path) -> str:
    """The worker main process's collections (count, longest pause) from its stats file."""
    import json

    if not stats.exists():
        return "gc: (no stats)"
    for line in stats.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "gc":
            return "gc: " + ", ".join(
                f"gen{g} {row[f'gen{g}']['count']}x max {row[f'gen{g}']['max_ms']:.1f} ms"
                for g in (0, 1, 2)
            )
    return "gc: (no stats)"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


#: a message's way from the publisher to its body, as the trace records it
STAGES = (
    ("published", "publish -> delivered to the gate"),
    ("delivered", "gate -> pool start stored"),
    ("started", "pool start -> completion stored"),
)


def breakdown(trace_dir: Path) -> list[str]:
    """Where a BeetleTask's publish-to-completion goes, stage by stage (ms), from the trace
    events of one :func:`latency` run: p50 and p99 of each stage, and the mean of each
    stage over the slowest 1 % of messages (the tail), so a reader sees which stage makes
    the tail."""
    import json

    times: dict[str, dict[str, int]] = {}
    for path in trace_dir.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind not in ("published", "delivered", "started", "completed"):
                continue
            seen = times.setdefault(event["message_id"], {})
            seen[kind] = min(seen.get(kind, event["ts_ms"]), event["ts_ms"])
    whole = [t for t in times.values() if len(t) == 4]
    whole = whole[len(whole) // 10 :]  # warmed up
    if not whole:
        return ["(no complete messages in the trace)"]
    order = ("published", "delivered", "started", "completed")
    total = sorted(whole, key=lambda t: t["completed"] - t["published"])
    tail = total[int(len(total) * 0.99) :]
    lines = [
        f"{len(whole)} messages traced; publish -> completion stored: "
        f"p50 {_pct([t['completed'] - t['published'] for t in whole], 0.5)} ms, "
        f"p99 {_pct([t['completed'] - t['published'] for t in whole], 0.99)} ms; "
        f"the slowest {len(tail)}:"
    ]
    for (start, label), end in zip(STAGES, order[1:], strict=True):
        spans = [t[end] - t[start] for t in whole]
        mean_tail = sum(t[end] - t[start] for t in tail) / len(tail)
        lines.append(
            f"  {label:38} p50 {_pct(spans, 0.5):5} ms  p99 {_pct(spans, 0.99):5} ms  "
            f"tail mean {mean_tail:7.1f} ms"
        )
    return lines


def scaling_rate(
    broker: str, redis_url: str, task_name: str, workers_n: int, tasks: int, tmp: Path
) -> float:
    queue = f"scale-{task_name.split('.')[1]}-{workers_n}-{time.monotonic_ns()}"
    out = tmp / f"{queue}.out"
    fill(broker, redis_url, task_name, queue, tasks)
    with workers(broker, redis_url, queue, out, count=workers_n) as procs:
        _wait_for(out, tasks, 300, procs)
        time.sleep(1.0)
    stamps = sorted(ran for ran, _ in _runs(out))
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rates", default="0.5,0.9", help="fractions of BeetleTask's peak")
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--plot", type=Path, help="draw the scaling figure into this PNG")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also run BeetleTask at the first rate with trace events on, and print where "
        "its latency goes, stage by stage",
    )
    parser.add_argument(
        "--gate-claims-too",
        action="store_true",
        help="also run BeetleTask at each rate with beetle_claim_in_idle_pool off (the gate "
        "claims first, then the pool starts: two round trips before the body)",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="an experiment: the workers call gc.freeze() once ready (both kinds)",
    )
    opts = parser.parse_args()
    global GC_FREEZE
    GC_FREEZE = opts.gc_freeze
    tmp = Path(tempfile.mkdtemp(prefix="bench-lat-"))
    server = RedisServer(tmp / "redis")
    server.start()
    try:
        with rabbit_ports(4 if opts.scaling else 2) as ports:
            single = f"pyamqp://guest:guest@127.0.0.1:{ports[0]}//"

            def beetle_url(n: int) -> str:
                hosts = ",".join(f"127.0.0.1:{p}" for p in ports[:n])
                return f"beetle://guest:guest@{hosts}//"

            both = beetle_url(2)
            peaks = {}
            for name, url in ((PLAIN, single), (BEETLE, both)):
                queue = f"peak-{name.split('.')[1]}"
                fill(url, server.url, name, queue, opts.tasks)
                peaks[name], _ = run_worker(url, server.url, queue, opts.tasks, "prefork", 2, tmp)
            print(
                f"peak (drained from full, prefork -c 2): plain {peaks[PLAIN]:.0f}/s, "
                f"BeetleTask {peaks[BEETLE]:.0f}/s"
            )
            # The rates below are fractions of the peak *with the publisher on the same
            # cores*: drained from a full queue, the worker had the machine to itself.
            live = {
                name: latency(url, server.url, name, math.inf, opts.tasks, tmp)[3]
                for name, url in ((PLAIN, single), (BEETLE, both))
            }
            print(
                f"peak (publishing as fast as it can meanwhile): plain {live[PLAIN]:.0f}/s, "
                f"BeetleTask {live[BEETLE]:.0f}/s"
            )
            for fraction in (float(f) for f in opts.rates.split(",")):
                rate = fraction * live[BEETLE]
                plain = latency(single, server.url, PLAIN, rate, opts.tasks, tmp)
                twin = latency(both, server.url, PLAIN, rate, opts.tasks, tmp, twice=True)
                claim = latency(both, server.url, CLAIMED, rate, opts.tasks, tmp, twice=True)
                beetle = latency(both, server.url, BEETLE, rate, opts.tasks, tmp)
                print(
                    f"at {fraction:.0%} of BeetleTask's peak ({rate:.0f}/s; sent "
                    f"{plain[2]:.0f}/s, {twin[2]:.0f}/s and {beetle[2]:.0f}/s): "
                    f"plain p50 {plain[0]:.1f} ms p99 {plain[1]:.1f} ms; "
                    f"two copies, no dedup p50 {twin[0]:.1f} ms p99 {twin[1]:.1f} ms; "
                    f"BeetleTask p50 {beetle[0]:.1f} ms p99 {beetle[1]:.1f} ms; "
                    f"p99 beetle/plain {beetle[1] / plain[1]:.2f} (target <= 1.3), "
                    f"two copies/plain {twin[1] / plain[1]:.2f}, "
                    f"beetle/two copies {beetle[1] / twin[1]:.2f}"
                )
                print(
                    f"  the ceiling, two copies and one claim (SET NX in Redis from the pool "
                    f"before the body; sent {claim[2]:.0f}/s): p50 {claim[0]:.1f} ms "
                    f"p99 {claim[1]:.1f} ms; its p99/plain {claim[1] / plain[1]:.2f}, "
                    f"BeetleTask's p99/its {beetle[1] / claim[1]:.2f}"
                )
                if opts.gate_claims_too:
                    gated = latency(
                        both, server.url, BEETLE, rate, opts.tasks, tmp, gate_claims=True
                    )
                    print(
                        f"  BeetleTask with the gate claiming first (beetle_claim_in_idle_pool "
                        f"off): p50 {gated[0]:.1f} ms p99 {gated[1]:.1f} ms; "
                        f"p99 /plain {gated[1] / plain[1]:.2f}"
                    )
                print(f"  worker main process, plain {GC_SEEN.get('plain')}")
                print(f"  worker main process, two copies {GC_SEEN.get('twice')}")
                print(f"  worker main process, two copies and a claim {GC_SEEN.get('claimed')}")
                print(f"  worker main process, BeetleTask {GC_SEEN.get('beetle')}")
            if opts.breakdown:
                fraction = float(opts.rates.split(",")[0])
                trace_dir = tmp / "trace"
                p50, p99, *_ = latency(
                    both, server.url, BEETLE, fraction * live[BEETLE], opts.tasks, tmp,
                    trace_dir=trace_dir,
                )  # fmt: skip
                print(
                    f"BeetleTask at {fraction:.0%} with trace events on: p50 {p50:.1f} ms, "
                    f"p99 {p99:.1f} ms; by stage (trace clock, ms):"
                )
                for line in breakdown(trace_dir):
                    print(f"  {line}")
            if opts.scaling:
                scale(single, beetle_url, server.url, opts, tmp)
    finally:
        server.kill()


def scale(
    single: str,
    beetle_url: Callable[[int], str],
    redis_url: str,
    opts: argparse.Namespace,
    tmp: Path,
) -> None:
    counts = (1, 2, 3)
    rows: dict[str, list[float]] = {}
    rows["plain, 1 broker"] = [
        scaling_rate(single, redis_url, PLAIN, w, opts.tasks, tmp) for w in counts
    ]
    for brokers in (2, 3, 4):
        rows[f"BeetleTask, {brokers} brokers"] = [
            scaling_rate(beetle_url(brokers), redis_url, BEETLE, w, opts.tasks, tmp) for w in counts
        ]
    print("tasks/s by workers (each prefork -c 2):     " + "".join(f"{w:>9}" for w in counts))
    for label, rates in rows.items():
        print(f"  {label:40}" + "".join(f"{r:9.0f}" for r in rates))
    if opts.plot:
        plot(rows, counts, opts.plot)
        print(f"figure: {opts.plot}")


def plot(rows: dict[str, list[float]], counts: tuple[int, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for label, rates in rows.items():
        ax.plot(counts, rates, marker="o", linestyle="--" if "plain" in label else "-", label=label)
    ax.set_xticks(counts)
    ax.set_xlabel("workers (prefork -c 2 each)")
    ax.set_ylabel("tasks/s (empty bodies)")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput by fleet size, one 2-core machine running everything")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


if __name__ == "__main__":
    main()
