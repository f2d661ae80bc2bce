"""The README demo: two brokers, two workers, a publisher, and faults halfway.

Starts two local RabbitMQ nodes and a Redis server on free ports (unless BEETLE_BROKER_URL
and BEETLE_REDIS_URL name yours), two Celery workers running ``examples.demo_app``, and
publishes BeetleTask messages (each to both brokers).  Halfway it kills one broker and one
worker with SIGKILL, later brings the broker back, and prints what was published,
completed, dropped as duplicates, and whether every task ran exactly once.  It ends with a
task that fails and is dead-lettered, lists the dead letter, "fixes the bug" and replays it.
Then the outbox (:mod:`examples.demo_outbox`): orders committed with their tasks, one rolled
back, the relay killed halfway; every committed order's task runs once, the rolled-back one
never (on a local PostgreSQL unless ``BEETLE_OUTBOX_DB`` is set).

    python -m examples.demo [--tasks 600] [--audit]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import RabbitNode, RedisServer, start_all  # noqa: E402
from tests.harness.celery_worker import WorkerProcess  # noqa: E402

console = Console()


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
    start_all(nodes)
    redis.start()
    try:
        hosts = ",".join(node.host_port for node in nodes)
        yield f"beetle://guest:guest@{hosts}//", redis.url, nodes
    finally:
        for node in nodes:
            node.kill()
        redis.kill()


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
    base = Path(tempfile.mkdtemp(prefix="beetle-demo-"))
    (base / "runs.log").touch()
    with servers(base) as (broker_url, redis_url, nodes):
        os.environ.update(
            BEETLE_BROKER_URL=broker_url, BEETLE_REDIS_URL=redis_url, BEETLE_DEMO_DIR=str(base)
        )
        env = {"BEETLE_BROKER_URL": broker_url, "BEETLE_REDIS_URL": redis_url,
               "BEETLE_DEMO_DIR": str(base)}  # fmt: skip
        workers = [
            WorkerProcess(
                "examples.demo_app",
                base / f"worker{i}.log",
                env,
                pool="prefork",
                concurrency=2,
                name=f"demo{i}",
            )
            for i in range(2)
        ]
        console.print(f"broker URL: [bold]{broker_url.replace('guest:guest', 'guest:**')}[/]")
        for worker in workers:
            worker.start()
        console.print("two workers ready; publishing …")
        from examples.demo_app import app

        published: list[int] = []
        stop = threading.Event()
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
        runs = wait_for_runs(base / "runs.log", set(published), timeout=120)
        elapsed = time.monotonic() - started
        report(base, published, runs, elapsed)
        dead_letter_and_replay(app, broker_url, redis_url, base)
        from examples import demo_outbox

        demo_outbox.run(app, base, env)
        workers[1].stop()
        if args.audit:
            run_audit(base)


def wait_for_runs(path: Path, wanted: set[int], timeout: float) -> Counter[int]:
    deadline = time.monotonic() + timeout
    while True:
        runs = Counter(int(line.split()[0]) for line in path.read_text().splitlines())
        if wanted <= set(runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def trace_counts(base: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in (base / "trace").glob("*.jsonl"):
        for line in path.open():
            with contextlib.suppress(ValueError):
                counts[json.loads(line)["event"]] += 1
    return counts


def report(base: Path, published: list[int], runs: Counter[int], elapsed: float) -> None:
    events = trace_counts(base)
    twice = sorted(i for i, n in runs.items() if n > 1)
    missing = sorted(set(published) - set(runs))
    table = Table(title="beetle demo", show_header=False)
    table.add_row("tasks published (each to 2 brokers)", str(len(published)))
    table.add_row("deliveries seen by the workers", str(events["delivered"]))
    table.add_row("duplicates dropped before the pool", str(events["duplicate"]))
    table.add_row("copies deferred while another ran", str(events["deferred"]))
    table.add_row("tasks completed", str(len(runs)))
    table.add_row("tasks run more than once", str(len(twice)))
    table.add_row("tasks never run", str(len(missing)))
    table.add_row("seconds", f"{elapsed:.1f}")
    console.print(table)
    if not twice and not missing:
        console.print("[bold green]every task ran exactly once[/]")
    else:
        console.print(f"[bold red]run twice: {twice[:10]}  never run: {missing[:10]}[/]")
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
    table = Table(title="beetle dead list celery")
    for column in ("message id", "task", "reason", "exception", "brokers"):
        table.add_column(column)
    for d in letters:
        s = d.summary()
        table.add_row(d.message_id, d.task, d.reason, s["message"], ", ".join(d.brokers))
    console.print(table)
    broken.unlink()
    console.print("the bug is fixed: beetle dead replay celery --task demo.refund")
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
