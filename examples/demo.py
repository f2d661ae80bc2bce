"""The README demo: two brokers, two workers, a publisher, and faults halfway.

Starts two local RabbitMQ nodes and a Redis server on free ports (unless BEETLE_BROKER_URL
and BEETLE_REDIS_URL name yours), a throwaway PostgreSQL (unless ``BEETLE_OUTBOX_DB`` names
a database; SQLite when PostgreSQL is not installed), two Celery workers running
``examples.demo_app``, and publishes BeetleTask charges (each to both brokers). Halfway it
kills one broker and one worker with SIGKILL, later brings the broker back, and prints what
was published, delivered, dropped as duplicates, and whether each charge was recorded once.

A charge commits its row through the inbox, in the transaction that marks its message done.
The killed worker leaves bodies interrupted: a body killed before its commit runs again
elsewhere and records the charge; one killed after its commit, before its completion reached
Redis, runs again too (beetle's promise for a crashed body) and finds its charge committed.
So the demo counts the charges' rows, not the bodies' runs, and shows the interrupted bodies
(from the trace: started, never completed, in the killed worker) on a line of their own.

It ends with a task that fails and is dead-lettered, lists the dead letter, "fixes the bug"
and replays it; then the outbox (:mod:`examples.demo_outbox`): orders committed with their
tasks, one rolled back, the relay killed halfway; every committed order charged once, the
rolled-back one never (skipped without PostgreSQL).

Every process it starts (workers, relays, brokers, Redis, PostgreSQL) is stopped, by pid,
however it ends: success, failure, an error, Ctrl-C or SIGTERM.

    python -m examples.demo [--tasks 600] [--audit]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_beetle.testing.rabbit import RabbitNode, start_all  # noqa: E402
from celery_beetle.testing.redis_server import RedisServer  # noqa: E402
from celery_beetle.testing.worker import WorkerProcess  # noqa: E402
from examples.demo_charges import Charges  # noqa: E402

console = Console()

#: name prefix of the worker the demo kills (its trace events carry it)
KILLED = "demo0"


@contextlib.contextmanager
def servers(base: Path) -> Iterator[tuple[str, str, list[RabbitNode]]]:
    """Broker URL, Redis URL and the local nodes (none when the environment names servers)."""
    broker_url, redis_url = os.environ.get("BEETLE_BROKER_URL"), os.environ.get("BEETLE_REDIS_URL")
    if broker_url and redis_url:
        yield broker_url, redis_url, []
        return
    console.print("starting two RabbitMQ brokers and a Redis server on free ports …")
    nodes = [RabbitNode(base / f"rabbit{i}", management=False) for i in range(2)]
    redis = RedisServer(base / "redis")
    with contextlib.ExitStack() as stack:
        for server in (*nodes, redis):
            stack.callback(server.kill)
        start_all(nodes)
        redis.start()
        hosts = ",".join(node.host_port for node in nodes)
        yield f"beetle://guest:guest@{hosts}//", redis.url, nodes


@contextlib.contextmanager
def running(workers: list[WorkerProcess]) -> Iterator[list[WorkerProcess]]:
    """Start ``workers``; stop them (SIGTERM, then SIGKILL with their pool) on the way out."""
    try:
        for worker in workers:
            worker.start()
        yield workers
    finally:
        for worker in workers:
            worker.stop(timeout=15)
            worker.kill()


def exit_on_signals() -> None:
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP end the demo through every cleanup (SIGINT too,
    as it is ignored in a shell's background job, which Python would keep)."""

    def leave(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, leave)


def publish(app, count: int, rate: float, published: list[int], stop: threading.Event) -> None:
    task = app.tasks["demo.charge"]
    policy = {"max_retries": 100, "interval_start": 0.2, "interval_step": 0.2, "interval_max": 1}
    with app.producer_or_acquire() as producer:
        for order_id in range(count):
            if stop.is_set():
                return
            task.apply_async((order_id,), producer=producer, retry_policy=policy)
            published.append(order_id)
            time.sleep(1 / rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=600)
    parser.add_argument("--rate", type=float, default=100.0, help="tasks published per second")
    parser.add_argument("--audit", action="store_true", help="also run the Spark audit")
    args = parser.parse_args()
    exit_on_signals()
    try:
        demo(args)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; every process the demo started is stopped[/]")
        sys.exit(130)


def demo(args: argparse.Namespace) -> None:
    from examples import demo_outbox

    base = Path(tempfile.mkdtemp(prefix="beetle-demo-"))
    (base / "runs.log").touch()
    stop = threading.Event()
    # left in reverse: the publisher, the workers, the database, the brokers and Redis
    with contextlib.ExitStack() as stack:
        broker_url, redis_url, nodes = stack.enter_context(servers(base))
        postgres_url = stack.enter_context(demo_outbox.database(base))
        db_url = postgres_url or f"sqlite:///{base / 'demo.sqlite'}"
        env = {"BEETLE_BROKER_URL": broker_url, "BEETLE_REDIS_URL": redis_url,
               "BEETLE_DEMO_DIR": str(base), "BEETLE_DEMO_DB": db_url}  # fmt: skip
        os.environ.update(env)
        charges = Charges(db_url)
        stack.callback(charges.close)
        workers = [
            WorkerProcess(
                "examples.demo_app",
                base / f"worker{i}.log",
                env,
                pool="prefork",
                concurrency=2,
                name=f"demo{i}",
                root=ROOT,
            )
            for i in range(2)
        ]
        console.print(f"broker URL: [bold]{broker_url.replace('guest:guest', 'guest:**')}[/]")
        stack.enter_context(running(workers))
        stack.callback(stop.set)
        console.print("two workers ready; publishing …")
        from examples.demo_app import app

        published: list[int] = []
        publisher = threading.Thread(
            target=publish, args=(app, args.tasks, args.rate, published, stop), daemon=True
        )
        started = time.monotonic()
        publisher.start()
        while len(published) < args.tasks // 2 and publisher.is_alive():
            time.sleep(0.05)
        events = []
        if nodes:
            nodes[1].kill()
            events.append(f"killed broker {nodes[1].host_port} (SIGKILL) at task {len(published)}")
        workers[0].kill()
        events.append(f"killed worker 1 (SIGKILL) at task {len(published)}")
        for line in events:
            console.print(f"[red]✗ {line}[/]")
        time.sleep(3)
        if nodes:
            nodes[1].restart()
            console.print(f"[green]✓ broker {nodes[1].host_port} is back[/]")
        publisher.join()
        recorded = charges.wait_for(set(published), timeout=120)
        elapsed = time.monotonic() - started
        report(base, published, recorded, elapsed)
        dead_letter_and_replay(app, broker_url, redis_url, base)
        demo_outbox.run(app, base, env, postgres_url, charges)
        workers[1].stop()
        if args.audit:
            run_audit(base)


def trace_events(base: Path) -> Iterator[dict[str, Any]]:
    for path in (base / "trace").glob("*.jsonl"):
        for line in path.open():
            with contextlib.suppress(ValueError):
                yield json.loads(line)


def interrupted_by_the_kill(events: list[dict[str, Any]]) -> int:
    """Bodies the killed worker started and never completed (by message id)."""
    killed = [e for e in events if str(e.get("worker") or "").startswith(f"{KILLED}-")]
    started = {e["message_id"] for e in killed if e["event"] == "started"}
    completed = {e["message_id"] for e in killed if e["event"] == "completed"}
    return len(started - completed)


def body_runs(base: Path) -> Counter[str]:
    """How the bodies' runs ended: ``charged`` or ``found-committed`` (from runs.log)."""
    lines = (base / "runs.log").read_text().splitlines()
    return Counter(line.split()[2] for line in lines if len(line.split()) == 3)


def report(base: Path, published: list[int], recorded: Counter[int], elapsed: float) -> None:
    events = list(trace_events(base))
    counts = Counter(e["event"] for e in events)
    dead = {
        e["message_id"]
        for e in events
        if e["event"] == "dead_lettered" and e.get("task_name") == "demo.charge"
    }
    twice = sorted(i for i in published if recorded[i] > 1)
    missing = sorted(i for i in published if not recorded[i])
    runs = body_runs(base)
    table = Table(title="beetle demo", show_header=False)
    table.add_row("charges published (each to 2 brokers)", str(len(published)))
    table.add_row("deliveries seen by the workers", str(counts["delivered"]))
    table.add_row("duplicates dropped before the pool", str(counts["duplicate"]))
    table.add_row("copies deferred while another ran", str(counts["deferred"]))
    table.add_row("bodies interrupted by the kill", str(interrupted_by_the_kill(events)))
    table.add_row("  runs again that found the charge committed", str(runs["found-committed"]))
    table.add_row("charges recorded (committed rows)", str(sum(recorded[i] for i in published)))
    table.add_row("charges recorded more than once", str(len(twice)))
    table.add_row("charges never recorded", str(len(missing)))
    table.add_row("charges dead-lettered", str(len(dead)))
    table.add_row("seconds", f"{elapsed:.1f}")
    console.print(table)
    if not twice and not missing:
        console.print("[bold green]each charge recorded once[/]")
    else:
        console.print(f"[bold red]recorded twice: {twice[:10]}  never recorded: {missing[:10]}[/]")
        sys.exit(1)
    console.print(f"trace events in {base / 'trace'}: beetle audit {base / 'trace'} --out DIR")


def dead_letter_and_replay(app, broker_url: str, redis_url: str, base: Path) -> None:
    """A refund fails (a bug), is dead-lettered, listed, and replayed once the bug is fixed."""
    from celery_beetle.ops.dead_letters import list_dead_letters
    from celery_beetle.ops.replay import replay
    from celery_beetle.store import RedisStore

    broken = base / "refunds-broken"
    broken.touch()
    app.tasks["demo.refund"].delay(42)
    console.print("\na refund fails (a bug) and is dead-lettered …")
    deadline = time.monotonic() + 30
    letters: list = []
    while not letters and time.monotonic() < deadline:
        time.sleep(0.3)
        letters, _ = list_dead_letters(broker_url, "celery")
    table = Table(title="beetle dead list -Q celery")
    for column in ("message id", "task", "reason", "exception", "brokers"):
        table.add_column(column)
    for d in letters:
        s = d.summary()
        table.add_row(d.message_id, d.task, d.reason, s["message"], ", ".join(d.brokers))
    console.print(table)
    broken.unlink()
    console.print("the bug is fixed: beetle dead replay -Q celery --task demo.refund")
    store = RedisStore.from_url(redis_url)
    try:
        results = replay(broker_url, "celery", store, task="demo.refund")
    finally:
        store.close()
    for r in results:
        console.print(f"  {r.letter.message_id}: {r.outcome}, {r.detail}")
    refunds = base / "refunds.log"
    deadline = time.monotonic() + 30
    while not (refunds.exists() and refunds.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # the replay's second copy is dropped as a duplicate meanwhile
    ran = len(refunds.read_text().splitlines()) if refunds.exists() else 0
    colour = "green" if ran == 1 else "red"
    console.print(f"[bold {colour}]the replayed refund ran {ran} time(s)[/]")
    if ran != 1:
        sys.exit(1)


def run_audit(base: Path) -> None:
    from celery_beetle.audit.job import build_session, run_audit

    result = run_audit(build_session(), str(base / "trace"), str(base / "audit"))
    s = result.summary
    console.print(
        f"audit: {s['messages']} messages, {s['completed_once']} completed once, "
        f"{s['lost']} lost, {s['duplicated']} duplicated, {s['unexpected']} unexpected "
        f"(report: {result.files['report']})"
    )


if __name__ == "__main__":
    main()
