"""What exactly-once costs a worker: logical tasks per second, and Redis round trips.

Side by side in one run, same pool and concurrency, queues filled before the worker starts
(the clock runs from the first task start to the last task end, so worker start-up and
publishing are not measured):

- **baseline**: a plain Celery task on ``pyamqp://`` and one broker;
- **ceiling**: a plain task delivered twice (``redundant_queues``), the second copy dropped
  on an in-memory set in the main process (no Redis): what any deduplication of two
  deliveries in Celery's main process can reach on this machine;
- **beetle**: a BeetleTask on ``beetle://`` over two brokers: every task is delivered twice
  (once per broker), the gate reserves one copy and drops the other, the pool starts the
  body (one round trip: the attempt counts as the body begins) and the gate stores the
  completion before the ack.

Printed: tasks/s of each and the ratios beetle/plain, ceiling/plain and beetle/ceiling
(targets: beetle/ceiling >= 0.9 with empty bodies; beetle/plain >= 0.9 with ``--body-ms 5``),
Redis round trips per redundant pair (3: reserve, start, complete) and per dropped duplicate
(target <= 1), from the store's own ``round_trips`` counters (gate and pool processes),
cross-checked against Redis's ``INFO commandstats`` (which also shows any hidden trip, such
as a script load). A last phase publishes the same tasks again (same task ids: an outbox
relay retrying) to a fresh worker, so that every copy is a duplicate of a completed message:
what dropping costs when the gate has to ask Redis.

Usage::

    python -m benchmarks.bench_exactly_once [--tasks 3000] [--rounds 3] [--body-ms 0]
        [--pool prefork] [--concurrency 2] [--breakdown] [--trace] [--observability]

``--body-ms`` gives each task an I/O-bound body (a sleep), closer to real tasks than the
default empty body, which measures nothing but the per-message overhead. ``--breakdown`` also
times a plain task over ``beetle://`` (one copy) and a BeetleTask over ``pyamqp://`` (one
copy, deduplicated), to show what the transport and the dedup each cost. ``--observability``
times BeetleTask with trace events and Prometheus metrics on (scraped every second) against
both off, in tasks/s and in CPU time per task of the worker's processes (first run to last),
which moves far less than tasks/s with whatever else shares the two cores; it prints how
much off's own rounds differ (the noise) beside the ratios.

Brokers come from ``benchmarks/_nodes.py`` (``BEETLE_BENCH_PORTS`` or throwaway nodes); Redis
is a throwaway ``redis-server`` on a free port. This module is also the workers' Celery app
(``celery -A benchmarks.bench_exactly_once``), configured from ``BENCH_*`` variables.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import Celery, bootsteps
from celery.signals import (
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from kombu import Connection

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import celery_beetle  # noqa: E402
from benchmarks import _profile  # noqa: E402
from benchmarks._cpu import CpuMeter, listener_pid, tree_cpu_s  # noqa: E402
from celery_beetle import BeetleTask  # noqa: E402

# -- the workers' app ------------------------------------------------------------------------

app = Celery("bench_eo", broker=os.environ.get("BENCH_BROKER", "memory://"), set_as_current=False)
app.conf.beetle_redis_url = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15")
app.conf.worker_hijack_root_logger = False
app.conf.worker_prefetch_multiplier = int(os.environ.get("BENCH_PREFETCH", "4"))
app.conf.broker_connection_retry_on_startup = True
# "quorum": the queues the worker declares are quorum queues (``bench_peers``' cluster)
app.conf.task_default_queue_type = os.environ.get("BENCH_QUEUE_TYPE", "classic")
app.conf.task_create_missing_queue_type = app.conf.task_default_queue_type
app.conf.beetle_trace_dir = os.environ.get("BENCH_TRACE") or None
# "0": the gate claims every delivery first, a pool process free or not (the way before)
app.conf.beetle_claim_in_idle_pool = os.environ.get("BENCH_CLAIM_IN_IDLE_POOL", "1") == "1"
if os.environ.get("BENCH_METRICS_PORT"):
    app.conf.beetle_metrics_port = int(os.environ["BENCH_METRICS_PORT"])
    app.conf.beetle_metrics_addr = "127.0.0.1"
celery_beetle.install(app)
OUT = os.environ.get("BENCH_OUT", "/dev/null")
STATS = os.environ.get("BENCH_STATS", "")
BODY_S = float(os.environ.get("BENCH_BODY_MS", "0")) / 1000


def _note(i: float) -> None:
    """Write when the body ran, and its argument (``bench_latency`` sends the publish time)."""
    if BODY_S:
        time.sleep(BODY_S)  # an I/O-bound body: the worker waits, the CPU does not
    with open(OUT, "a") as out:
        out.write(f"{time.time():.6f} {i}\n")


@app.task(name="bench.plain")
def plain(i: float) -> None:
    _note(i)


@app.task(base=BeetleTask, name="bench.beetle", timeout=60)
def beetle(i: float) -> None:
    _note(i)


_claims: Any = None


def _redis() -> Any:
    global _claims
    if _claims is None:
        import redis

        _claims = redis.Redis.from_url(app.conf.beetle_redis_url)
    return _claims


@app.task(bind=True, name="bench.claimed")
def claimed(self: Any, i: float) -> None:
    """``bench.plain`` after one atomic claim in Redis (``SET NX PX``, one round trip from
    the pool process): the least any deduplicating task does before its body, so
    ``bench_latency``'s ceiling for a BeetleTask's latency."""
    _redis().set(f"bench:claim:{self.request.id}", 1, nx=True, px=60_000)
    _note(i)


@app.task(bind=True, name="bench.stored")
def stored(self: Any, i: float) -> None:
    """``bench.claimed``, and its outcome stored before the task returns (a second ``SET``,
    one more round trip from the pool process): the least a design that keeps every
    outcome does per task."""
    _redis().set(f"bench:claim:{self.request.id}", 1, nx=True, px=60_000)
    _note(i)
    _redis().set(f"bench:done:{self.request.id}", 1, px=60_000)


class MemoryDedup(bootsteps.StartStopStep):
    """The ceiling of any deduplication: ``bench.plain`` delivered twice, the second copy
    acked in the main process on an in-memory set, no Redis, no claim. Only in the worker
    that ``--breakdown`` starts with ``BENCH_MEMORY_DEDUP=1``."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        strategy = c.strategies["bench.plain"]
        if getattr(strategy, "memory_dedup", False):
            return
        seen: set[str] = set()

        def first_copy_only(message: Any, *args: Any, **kwargs: Any) -> Any:
            message_id = message.properties.get("message_id")
            if message_id in seen:
                seen.discard(message_id)
                message.ack()
                return None
            seen.add(message_id)
            return strategy(message, *args, **kwargs)

        first_copy_only.memory_dedup = True  # type: ignore[attr-defined]
        c.strategies["bench.plain"] = first_copy_only


#: the tasks whose second copy ``TransportDedup`` drops
_DROPPED_TWICE = frozenset({"bench.plain", "bench.claimed", "bench.stored"})


class TransportDedup(bootsteps.StartStopStep):
    """The ceiling of dropping the second copy in the transport, before kombu makes a
    Message of it (``beetle://``'s delivery filter, the hook the gate uses): ``bench.plain``
    (or ``bench.claimed``) delivered twice, the second copy acked on an in-memory set. Only with
    ``BENCH_TRANSPORT_DEDUP=1``. It starts after beetle's gate, which sets its own filter
    for the tasks it gates, and hands every other task's deliveries to that one."""

    # the gate's step by its blueprint name: started first, its filter is not put over ours
    requires = ("celery.worker.consumer.tasks:Tasks", "celery_beetle.bootstep.BeetleGateStep")

    def start(self, c: Any) -> None:
        seen: set[str] = set()
        connection = c.connection._connection
        gate_filter = connection.delivery_filter

        def second_copy_dropped(raw: Any, tag: str, deliver: Any) -> bool:
            headers = raw.properties.get("application_headers")
            if not isinstance(headers, dict) or headers.get("task") not in _DROPPED_TWICE:
                return bool(gate_filter(raw, tag, deliver)) if gate_filter else False
            message_id = raw.properties.get("message_id")
            if message_id not in seen:
                seen.add(message_id)
                return False
            seen.discard(message_id)
            raw.channel.basic_ack(raw.delivery_tag)
            return True

        connection.delivery_filter = second_copy_dropped


def _gc_pauses() -> dict[int, list[float]]:
    """Each garbage collection's pause in this process, by generation (seconds): a pause of
    the worker's main process holds every delivery in it, so it shows in the latency tail."""
    import gc

    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    began: list[float] = []

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began:
            pauses[info["generation"]].append(time.perf_counter() - began[0])

    gc.callbacks.append(timed)
    return pauses


GC_PAUSES = _gc_pauses() if os.environ.get("BENCH_GC") else None

if os.environ.get("BENCH_GC_FREEZE"):  # an experiment: start-up objects out of the collector

    @worker_ready.connect
    def _freeze(**kwargs: Any) -> None:
        import gc

        gc.freeze()


if os.environ.get("BENCH_GC_SAVEALL"):
    # What only the cyclic garbage collector frees, by type, written to this path (and to
    # path.<pid> by each pool process) as the worker stops: every object there was part of a
    # reference cycle, and a cycle per task makes the collector's full passes pause the worker

    @worker_ready.connect
    def _saveall(**kwargs: Any) -> None:
        import gc

        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)

    @worker_process_init.connect
    def _saveall_pool(**kwargs: Any) -> None:
        _saveall()

    @worker_process_shutdown.connect
    def _dump_pool(**kwargs: Any) -> None:
        _dump_garbage(suffix=f".{os.getpid()}")

    @worker_shutdown.connect
    def _dump_garbage(suffix: str = "", **kwargs: Any) -> None:
        import collections
        import gc

        kinds = collections.Counter(type(o).__name__ for o in gc.garbage)
        funcs = collections.Counter(
            getattr(o, "__qualname__", "?") for o in gc.garbage if type(o).__name__ == "function"
        )
        Path(os.environ["BENCH_GC_SAVEALL"] + suffix).write_text(
            json.dumps(
                {"kinds": kinds.most_common(25), "functions": funcs.most_common(25)}, indent=1
            )
        )


if os.environ.get("BENCH_MEMORY_DEDUP"):
    app.steps["consumer"].add(MemoryDedup)
if os.environ.get("BENCH_TRANSPORT_DEDUP"):
    app.steps["consumer"].add(TransportDedup)


def _dump(kind: str, data: dict[str, Any]) -> None:
    if STATS:
        with open(STATS, "a") as out:
            out.write(json.dumps({"kind": kind, "pid": os.getpid(), **data}) + "\n")


@worker_process_shutdown.connect
def _pool_stats(**kwargs: Any) -> None:
    from celery_beetle.worker.runnable import _stores

    _dump("pool", {"round_trips": sum(s.round_trips for s in _stores.values())})


@worker_shutdown.connect
def _gate_stats(sender: Any = None, **kwargs: Any) -> None:
    from celery_beetle.worker.runnable import _stores

    if GC_PAUSES is not None:
        _dump(
            "gc",
            {
                f"gen{gen}": {"count": len(p), "max_ms": 1000 * max(p, default=0.0),
                              "total_ms": 1000 * sum(p)}
                for gen, p in GC_PAUSES.items()
            },
        )  # fmt: skip
    step = getattr(getattr(sender, "consumer", None), "beetle_gate", None)
    gate = getattr(step, "gate", None)
    if gate is not None:
        pool = sum(s.round_trips for s in _stores.values())  # solo: the body runs here
        _dump("gate", {"round_trips": gate.store.round_trips + pool, "stats": dict(gate.stats)})


# -- the driver ------------------------------------------------------------------------------

BODY_MS = 0.0
PROFILE_POOL = False


def run_worker(
    broker: str,
    redis_url: str,
    queue: str,
    tasks: int,
    pool: str,
    concurrency: int,
    tmp: Path,
    trace_dir: str = "",
    extra_env: dict[str, str] | None = None,
    cpu_us: list[float] | None = None,
    servers: dict[str, list[int]] | None = None,
    cpu_by: dict[str, list[float]] | None = None,
    profile: Path | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """Start a worker on a filled queue; return (tasks/s, its stats lines). ``cpu_us``
    gets the CPU time its processes spent per task (µs, user + system); ``cpu_by`` gets it
    per group, for the worker and each group of ``servers`` (``{"brokers": [pid, ...]}``),
    and their total. With ``profile`` py-spy samples the worker's main process into it."""
    out, stats, log = tmp / f"{queue}.out", tmp / f"{queue}.stats", tmp / f"{queue}.log"
    env = {
        **os.environ,
        "BENCH_BROKER": broker,
        "BENCH_REDIS": redis_url,
        "BENCH_OUT": str(out),
        "BENCH_STATS": str(stats),
        "BENCH_BODY_MS": str(BODY_MS),
        "BENCH_TRACE": trace_dir,
        "PYTHONPATH": str(ROOT),
        **(extra_env or {}),
    }
    args = [
        sys.executable, "-m", "celery", "-A", "benchmarks.bench_exactly_once", "worker",
        "-P", pool, "-c", str(concurrency), "-Q", queue, "-l", "warning",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"bench-{queue}-{os.getpid()}@%h",
    ]  # fmt: skip
    out.touch()
    with log.open("wb") as log_file:
        proc = subprocess.Popen(args, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 300
    try:
        # CPU of the worker's process tree from the first run to the last, sampled on a short
        # poll: unlike tasks/s, CPU per task hardly moves with what else the machine runs
        first_cpu = None
        meter = CpuMeter(
            {"worker": [proc.pid], "main": [proc.pid], **(servers or {})}, alone=frozenset({"main"})
        )
        sampler = None
        while (done := _lines(out)) < tasks:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker stopped early:\n{log.read_text()[-3000:]}")
            if first_cpu is None and done:
                first_cpu, first_done = tree_cpu_s(proc.pid), done
                meter.start()
                if profile is not None:
                    sampler = _profile.start(proc.pid, profile, subprocesses=PROFILE_POOL)
            time.sleep(0.02)
        _profile.stop(sampler)
        if first_cpu is not None:
            runs = tasks - first_done
            if cpu_us is not None:
                cpu_us.append((tree_cpu_s(proc.pid) - first_cpu) * 1e6 / runs)
            if cpu_by is not None:
                used = meter.stop()
                total = sum(s for name, s in used.items() if name != "main")
                for name, seconds in {**used, "total": total}.items():
                    cpu_by.setdefault(name, []).append(seconds * 1e6 / runs)
        time.sleep(1.0)  # let the last copies be gated and acked
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    stamps = sorted(float(line.split()[0]) for line in out.read_text().splitlines() if line)
    elapsed = stamps[-1] - stamps[0]
    rate = (len(stamps) - 1) / elapsed if elapsed > 0 else float("inf")
    lines = [json.loads(x) for x in stats.read_text().splitlines()] if stats.exists() else []
    if len(stamps) != tasks:
        print(f"  WARNING: {queue}: {len(stamps)} runs for {tasks} tasks", file=sys.stderr)
    return rate, lines


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def fill(
    broker: str,
    redis_url: str,
    task_name: str,
    queue: str,
    tasks: int,
    task_ids: list[str] | None = None,
) -> list[str]:
    """Publish ``tasks`` tasks (with ``task_ids``: publish those again); return their ids."""
    client = Celery("bench_client", broker=broker, set_as_current=False)
    client.conf.beetle_redis_url = redis_url

    def body(i: int) -> None: ...

    base = BeetleTask if task_name == "bench.beetle" else None
    task = client.task(name=task_name, base=base, shared=False)(body)
    ids = []
    with client.producer_or_acquire() as producer:
        for i in range(tasks):
            task_id = task_ids[i] if task_ids else None
            ids.append(task.apply_async((i,), queue=queue, producer=producer, task_id=task_id).id)
    client.close()
    return ids


def drop_duplicates(
    broker: str, redis_url: str, queue: str, tasks: int, opts: Any, tmp: Path
) -> dict[str, Any]:
    """Start a worker on a queue of late duplicates (tasks that already completed, published
    again: an outbox relay's retry); return its gate's counters once it has dropped them."""
    out, stats, log = (tmp / f"{queue}-late{suffix}" for suffix in (".out", ".stats", ".log"))
    env = {
        **os.environ,
        "BENCH_BROKER": broker,
        "BENCH_REDIS": redis_url,
        "BENCH_OUT": str(out),
        "BENCH_STATS": str(stats),
        "PYTHONPATH": str(ROOT),
    }
    args = [
        sys.executable, "-m", "celery", "-A", "benchmarks.bench_exactly_once", "worker",
        "-P", opts.pool, "-c", str(opts.concurrency), "-Q", queue, "-l", "warning",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"bench-{queue}-{os.getpid()}@%h",
    ]  # fmt: skip
    with log.open("wb") as log_file:
        proc = subprocess.Popen(args, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    with Connection(broker) as conn:
        channel = conn.default_channel
        while time.monotonic() < deadline:
            if channel.queue_declare(queue=queue, passive=True).message_count == 0:
                break
            time.sleep(0.2)
    time.sleep(2.0)  # the last deliveries are gated and acked
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    lines = [json.loads(x) for x in stats.read_text().splitlines()] if stats.exists() else []
    gate = next((s for s in lines if s["kind"] == "gate"), {})
    runs = _lines(out) if out.exists() else 0
    return {**gate, "runs": runs}


def breakdown(
    single: str, both: str, redis_url: str, opts: Any, tmp: Path, base_rate: float
) -> None:
    """Where the cost goes: the transport alone, and dedup without redundancy (each round
    already times redundancy with a free dedup: the ceiling)."""
    for label, broker, task, queue, twice in (
        ("plain task, beetle://, 1 copy", both, "bench.plain", "bd-plain-beetle", False),
        ("BeetleTask, pyamqp, 1 copy", single, "bench.beetle", "bd-beetle-single", False),
    ):
        publish_url = f"{broker}?redundant_queues={queue}" if twice else broker
        fill(publish_url, redis_url, task, queue, opts.tasks)
        rate, _ = run_worker(
            broker, redis_url, queue, opts.tasks, opts.pool, opts.concurrency, tmp,
            extra_env={"BENCH_MEMORY_DEDUP": "1"} if twice else None,
        )  # fmt: skip
        print(f"{label + ':':36}{rate:8.0f} tasks/s  ({rate / base_rate:.2f} of plain)")


def tracing_overhead(both: str, redis_url: str, opts: Any, tmp: Path) -> None:
    """Worker throughput with trace events on against off, interleaved (target >= 0.9)."""
    off, on = [], []
    for n in range(opts.rounds):
        for rates, trace_dir in ((off, ""), (on, str(tmp / f"trace-{n}"))):
            queue = f"tr-{'on' if trace_dir else 'off'}-{n}"
            fill(both, redis_url, "bench.beetle", queue, opts.tasks)
            rate, _ = run_worker(
                both, redis_url, queue, opts.tasks, opts.pool, opts.concurrency, tmp, trace_dir
            )
            rates.append(rate)
    ratio = statistics.median(on) / statistics.median(off)
    print(f"BeetleTask, tracing off:            {statistics.median(off):8.0f} tasks/s")
    print(f"BeetleTask, tracing on:             {statistics.median(on):8.0f} tasks/s")
    print(f"tracing ratio (target >= 0.9):      {ratio:8.2f}")


def observability_overhead(both: str, redis_url: str, opts: Any, tmp: Path) -> None:
    """Worker throughput with trace events on, and with trace events and metrics on
    (scraped every second, as Prometheus would), against both off; interleaved rounds."""
    import threading
    import urllib.request

    from celery_beetle.testing.ports import free_port

    def scrape_every_second(port: int, stop: threading.Event, scrapes: list[int]) -> None:
        while not stop.wait(1.0):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    r.read()
                scrapes[0] += 1
            except OSError:
                pass  # not serving yet

    variants = ("off", "trace", "trace+metrics")
    rates: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    scrapes = [0]
    for n in range(opts.rounds):
        for variant in variants:
            queue = f"obs-{variant.replace('+', '-')}-{n}"
            fill(both, redis_url, "bench.beetle", queue, opts.tasks)
            stop = threading.Event()
            env: dict[str, str] | None = None
            trace_dir = "" if variant == "off" else str(tmp / f"obs-{queue}")
            if variant == "trace+metrics":
                port = free_port()
                env = {"BENCH_METRICS_PORT": str(port)}
                args = (port, stop, scrapes)
                threading.Thread(target=scrape_every_second, args=args, daemon=True).start()
            try:
                rate, _ = run_worker(
                    both, redis_url, queue, opts.tasks, opts.pool, opts.concurrency, tmp,
                    trace_dir, extra_env=env, cpu_us=cpu[variant],
                )  # fmt: skip
            finally:
                stop.set()
            rates[variant].append(rate)
            used = cpu[variant][-1]
            print(f"  round {n + 1}, {variant}: {rate:6.0f} tasks/s, {used:5.0f} µs CPU/task")
    off = statistics.median(rates["off"])
    off_cpu = statistics.median(cpu["off"])
    for variant in variants:
        median, cost = statistics.median(rates[variant]), statistics.median(cpu[variant])
        print(
            f"BeetleTask, {variant + ':':24}{median:7.0f} tasks/s  ({median / off:.2f} of off)"
            f"  {cost:5.0f} µs CPU/task  ({off_cpu / cost:.2f} of off's throughput per CPU)"
        )
    spread = statistics.pstdev(cpu["off"]) / off_cpu if len(cpu["off"]) > 1 else 0.0
    print(f"(noise: off's CPU/task varies by {spread:.1%} between rounds)")
    print(f"({scrapes[0]} scrapes of the metrics endpoint)")


def commandstats(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--pool", default="prefork")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--body-ms", type=float, default=0.0, help="each task sleeps this long (I/O-bound body)"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="also time plain and BeetleTask in between"
    )
    parser.add_argument(
        "--trace", action="store_true", help="also time BeetleTask with trace events on"
    )
    parser.add_argument(
        "--observability",
        action="store_true",
        help="also time BeetleTask with trace events and metrics on (scraped every second)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy the worker's main process in the last round's plain and beetle runs; "
        "raw profiles and their summaries go to this directory",
    )
    parser.add_argument(
        "--profile-pool",
        action="store_true",
        help="with --profile, sample the pool processes too (each process's share printed)",
    )
    opts = parser.parse_args()
    global BODY_MS, PROFILE_POOL
    BODY_MS = opts.body_ms
    PROFILE_POOL = opts.profile_pool

    from benchmarks._nodes import rabbit_ports
    from celery_beetle.testing.redis_server import RedisServer

    tmp = Path(tempfile.mkdtemp(prefix="bench-eo-"))
    server = RedisServer(tmp / "redis")
    server.start()
    try:
        with rabbit_ports(2) as ports:
            single = f"pyamqp://guest:guest@127.0.0.1:{ports[0]}//"
            both = f"beetle://guest:guest@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}//"
            redis_url = server.url
            print(
                f"{opts.tasks} tasks x {opts.rounds} rounds, body {opts.body_ms} ms, "
                f"pool {opts.pool} "
                f"-c {opts.concurrency}, brokers {ports}"
            )
            base_rates, rates, ceilings, dropped_early = [], [], [], []
            servers = {
                "brokers": [p for p in map(listener_pid, ports) if p is not None],
                "redis": [server.pid] if server.pid else [],
            }
            cpu: dict[str, dict[str, list[float]]] = {}
            if opts.profile:
                opts.profile.mkdir(parents=True, exist_ok=True)
            for n in range(opts.rounds):
                last = n == opts.rounds - 1

                def timed(
                    kind: str, url: str, queue: str, last: bool = last, **kw: Any
                ) -> tuple[float, Any]:
                    profile = opts.profile / f"{kind}.txt" if opts.profile and last else None
                    return run_worker(
                        url, redis_url, queue, opts.tasks, opts.pool, opts.concurrency, tmp,
                        servers=servers, cpu_by=cpu.setdefault(kind, {}), profile=profile, **kw,
                    )  # fmt: skip

                fill(single, redis_url, "bench.plain", f"bench-plain-{n}", opts.tasks)
                twice, early = f"bench-twice-{n}", f"bench-early-{n}"
                for queue in (twice, early):
                    fill(
                        f"{both}?redundant_queues={queue}", redis_url, "bench.plain", queue,
                        opts.tasks,
                    )  # fmt: skip
                last_ids = fill(both, redis_url, "bench.beetle", f"bench-beetle-{n}", opts.tasks)
                base_rate, _ = timed("plain", single, f"bench-plain-{n}")
                ceiling, _ = timed("ceiling", both, twice, extra_env={"BENCH_MEMORY_DEDUP": "1"})
                early_rate, _ = timed(
                    "transport", both, early, extra_env={"BENCH_TRANSPORT_DEDUP": "1"}
                )
                with server.client() as client:
                    before = commandstats(client)
                rate, stats = timed("beetle", both, f"bench-beetle-{n}")
                with server.client() as client:
                    after = commandstats(client)
                print(
                    f"  round {n + 1}: plain {base_rate:6.0f}/s, ceiling {ceiling:6.0f}/s, "
                    f"transport ceiling {early_rate:6.0f}/s, beetle {rate:6.0f}/s; "
                    f"beetle/plain {rate / base_rate:.2f}, beetle/ceiling {rate / ceiling:.2f}"
                )
                base_rates.append(base_rate)
                rates.append(rate)
                ceilings.append(ceiling)
                dropped_early.append(early_rate)
            queue = f"bench-beetle-{opts.rounds - 1}"  # same queue, same ids: duplicates
            fill(both, redis_url, "bench.beetle", queue, opts.tasks, task_ids=last_ids)
            late = drop_duplicates(both, redis_url, queue, opts.tasks, opts, tmp)
            if opts.breakdown:
                breakdown(single, both, redis_url, opts, tmp, statistics.median(base_rates))
            if opts.trace:
                tracing_overhead(both, redis_url, opts, tmp)
            if opts.observability:
                observability_overhead(both, redis_url, opts, tmp)
    finally:
        server.kill()
    report(
        opts.tasks,
        statistics.median(base_rates),
        statistics.median(rates),
        statistics.median(ceilings),
        stats,
        before,
        after,
    )
    print(
        f"transport ceiling (2 copies, the second dropped in memory before kombu's Message): "
        f"{statistics.median(dropped_early):.0f} tasks/s, "
        f"{statistics.median(dropped_early) / statistics.median(base_rates):.2f} of plain"
    )
    print_cpu(cpu)
    if opts.profile:
        for kind in ("plain", "beetle"):
            print(f"py-spy, the worker's main process, {kind} (last round):")
            for line in _profile.summary(opts.profile / f"{kind}.txt"):
                print(f"  {line}")
    reads = late.get("round_trips", 0)
    dropped = late.get("stats", {}).get("duplicate", 0)
    print(
        f"late duplicates (the same {opts.tasks} tasks published again, 2 copies each): "
        f"{dropped} copies dropped, {late.get('runs', 0)} runs, "
        f"{reads / max(dropped, 1):.2f} round trips per dropped copy (target <= 1)"
    )


def print_cpu(cpu: dict[str, dict[str, list[float]]]) -> None:
    """CPU per task of each run, by process group (medians over the rounds, µs)."""
    print("CPU per task, µs (medians; worker = its whole process tree, main = its main process):")
    groups = ["worker", "main", "brokers", "redis", "total"]
    print(f"  {'':10}" + "".join(f"{g:>10}" for g in groups))
    for kind, by in cpu.items():
        cells = [statistics.median(by[g]) if by.get(g) else float("nan") for g in groups]
        print(f"  {kind:10}" + "".join(f"{c:10.0f}" for c in cells))
    plain, beetle = cpu.get("plain"), cpu.get("beetle")
    if (
        plain
        and beetle
        and all(plain.get(g) for g in groups)
        and all(beetle.get(g) for g in groups)
    ):
        # brokers and Redis share this machine's cores with the worker: with a worker that
        # cost no more than plain's, a BeetleTask's CPU per task would still be this much
        floor = sum(
            statistics.median(x) for x in (plain["worker"], beetle["brokers"], beetle["redis"])
        )
        bound = statistics.median(plain["total"]) / floor
        print(
            f"this machine's bound for beetle/plain, CPU-bound (plain's worker, beetle's brokers "
            f"and Redis: {floor:.0f} µs/task): {bound:.2f}"
        )


def report(
    tasks: int,
    base_rate: float,
    rate: float,
    ceiling: float,
    stats: list[dict[str, Any]],
    before: dict[str, int],
    after: dict[str, int],
) -> None:
    trips = sum(s["round_trips"] for s in stats)
    gate = next((s["stats"] for s in stats if s["kind"] == "gate"), {})
    calls = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    calls = {k: v for k, v in calls.items() if v and k not in ("info", "hello")}
    # commandstats also counts the commands a script runs; each script reads its record
    # with one HMGET, so the gate's own reads are the HMGETs beyond one per script
    scripts = calls.get("evalsha", 0) + calls.get("eval", 0)
    wire = scripts + calls.get("script|load", 0) + calls.get("hmget", 0) - scripts
    # reads spent on copies that ran nothing: dropped ones, minus those dropped from the
    # gate's memory of runs completed here (no read), plus every deferral's read
    dup_reads = gate.get("duplicate", 0) - gate.get("known_completed", 0) + gate.get("deferred", 0)
    print("medians over the rounds:")
    print(f"plain task, pyamqp, 1 broker:       {base_rate:8.0f} tasks/s")
    print(f"plain task, 2 copies, memory dedup: {ceiling:8.0f} tasks/s  (the ceiling)")
    print(f"BeetleTask, beetle://, 2 copies:    {rate:8.0f} tasks/s")
    print(f"beetle / plain:                     {rate / base_rate:8.2f}  (5 ms bodies: >= 0.9)")
    print(f"ceiling / plain:                    {ceiling / base_rate:8.2f}")
    print(f"beetle / ceiling:                   {rate / ceiling:8.2f}  (target >= 0.9)")
    print(f"round trips per redundant pair (3 expected): {trips / tasks:.2f}  (store counters)")
    print(f"  from INFO commandstats: {wire / tasks:.2f}  (last round; {calls})")
    if gate.get("duplicate"):
        print(
            f"round trips per dropped duplicate (target <= 1): "
            f"{dup_reads / gate['duplicate']:.2f}  (gate reads that ran nothing / duplicates)"
        )
    print(f"gate: {gate}")


if __name__ == "__main__":
    main()
