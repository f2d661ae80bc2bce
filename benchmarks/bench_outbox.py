"""The transactional outbox: what enqueueing costs, how fast the relay drains, how long a
committed task waits to be published. Each figure beside its baseline, measured in the same
run (rounds interleaved, so both sides see the same machine load).

- enqueue cost: a transaction inserting one business row and the task's outbox row,
  against the same transaction without the outbox row (ratio: with / without);
- relay throughput to two brokers (``publish_many``: a batch's copies all in flight, rows
  deleted as confirms arrive) against direct ``apply_async`` of the same BeetleTask over
  ``beetle://`` (one confirm round trip per task). Target: ratio >= 3; and against the
  machine's ceiling for it, a bare py-amqp publisher of the same messages to the same two
  brokers with confirms pipelined (a window of ``--batch-size``). Target: >= 0.8 of it;
- commit-to-publish latency p50/p99 at a steady load (commit until the relay's pass that
  published it committed its delete: an upper bound).
- NOTIFY wake-ups (opt-in) against polling: commit-to-publish p50/p99 at the steady rate
  and at a low one (where the adaptive poll has backed off), and what the NOTIFY costs the
  enqueue transaction, one enqueuer and ``--writers`` side by side (PostgreSQL queues a
  notification under a database-wide lock at commit).

Local throwaway PostgreSQL and two RabbitMQ nodes (BEETLE_BENCH_PORTS names brokers instead).

    python -m benchmarks.bench_outbox [--tasks 3000] [--rounds 3] [--rate 400] [--low-rate 2]
                                      [--writers 4] [--notify-only] [--ceiling-only]
                                      [--profile DIR]

``--ceiling-only`` times only the relay against the pipelined publisher (a minute, not
several); ``--profile DIR`` has py-spy sample this process during the relay's rounds (one raw
file per round in DIR, summed by function when the run ends).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import amqp
import sqlalchemy as sa
from celery import Celery
from kombu import Connection
from sqlalchemy.orm import Session

import celery_beetle
from benchmarks import _profile
from benchmarks._nodes import rabbit_ports
from celery_beetle import BeetleTask, outbox
from celery_beetle.outbox.relay import Relay
from celery_beetle.outbox.table import OUTBOX, create_tables

ORDERS = sa.Table(
    "bench_orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("total", sa.Integer, nullable=False),
)


def make_app(url: str) -> Celery:
    app = Celery("bench", broker=url, set_as_current=False)
    app.conf.task_default_queue = "bench"
    app.conf.beetle_redis_url = "redis://127.0.0.1:1/0"  # never used: nothing consumes
    celery_beetle.install(app)

    @app.task(base=BeetleTask, name="bench.charge", shared=False)
    def charge(order_id: int) -> int:
        return order_id

    return app


def enqueue_rate(engine: sa.Engine, task: Any, n: int, with_outbox: bool) -> float:
    started = time.perf_counter()
    for i in range(n):
        with Session(engine) as session, session.begin():
            session.execute(sa.insert(ORDERS), [{"total": i}])
            if with_outbox:
                outbox.delay(session, task, i)
    return n / (time.perf_counter() - started)


def concurrent_enqueue_rate(engine: sa.Engine, task: Any, n: int, writers: int) -> float:
    """Transactions per second of ``writers`` threads, each a business row and a task."""
    threads = [
        threading.Thread(target=enqueue_rate, args=(engine, task, n // writers, True))
        for _ in range(writers)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return (n // writers) * writers / (time.perf_counter() - started)


def direct_rate(app: Celery, task: Any, n: int) -> float:
    with app.producer_or_acquire() as producer:
        task.apply_async((0,), producer=producer)  # declare and warm up
        started = time.perf_counter()
        for i in range(n):
            task.apply_async((i,), producer=producer)
        return n / (time.perf_counter() - started)


def pipelined_rate(app: Celery, ports: list[int], n: int, window: int) -> float:
    """The relay's ceiling on this machine: bare py-amqp publishing the relay's messages (a
    BeetleTask's headers and body, same size) to two brokers with confirms pipelined: up to
    ``window`` unconfirmed messages per broker, each broker's acks (``multiple`` included)
    counted as they come. No database, no Celery, no beetle."""
    task = app.amqp.as_task_v2("00000000-0000-0000-0000-000000000000", "bench.charge", args=(0,))
    body = json.dumps(task.body).encode()
    headers = {k: v for k, v in task.headers.items() if v is not None}
    links = []
    for port in ports:
        connection = amqp.Connection(f"127.0.0.1:{port}")
        connection.connect()
        channel = connection.channel()
        channel.confirm_select()
        channel.queue_declare("bench-pipelined", durable=True, auto_delete=False)
        confirmed = [0]

        def on_ack(tag: int, multiple: bool, confirmed: list[int] = confirmed) -> None:
            confirmed[0] = tag if multiple else max(confirmed[0], tag)

        channel.events["basic_ack"].add(on_ack)
        links.append((connection, channel, confirmed))
    try:
        started = time.perf_counter()
        sent = 0
        while True:
            behind = min(confirmed[0] for _, _, confirmed in links)
            if sent >= n and behind >= n:
                break
            if sent < n and sent - behind < window:
                message = amqp.Message(
                    body, delivery_mode=2, content_type="application/json",
                    content_encoding="utf-8", application_headers=headers, message_id=f"m{sent}",
                )  # fmt: skip
                for _, channel, _ in links:
                    channel.basic_publish(message, routing_key="bench-pipelined")
                sent += 1
                continue
            for connection, _, confirmed in links:
                if confirmed[0] < sent:
                    connection.drain_events(timeout=5)
        return n / (time.perf_counter() - started)
    finally:
        for connection, channel, _ in links:
            channel.queue_delete("bench-pipelined")
            connection.close()


def relay_rate(
    relay: Relay, engine: sa.Engine, task: Any, n: int, profile: Path | None = None
) -> float:
    with Session(engine) as session, session.begin():
        for i in range(n):
            outbox.delay(session, task, i)
    sampler = _profile.start(os.getpid(), profile) if profile is not None else None
    try:
        if sampler is not None:
            time.sleep(0.5)  # py-spy attaches
        started = time.perf_counter()
        relayed = 0
        while relayed < n:
            relayed += len(relay.relay_once().relayed)
        return n / (time.perf_counter() - started)
    finally:
        _profile.stop(sampler)


def print_ceiling(rows: dict[str, list[float]], args: argparse.Namespace) -> None:
    """The relay against the pipelined publisher, round by round and in the median."""
    ratios = [r / p for r, p in zip(rows["relay"], rows["pipelined"], strict=True)]
    for index, (relay, bare, ratio) in enumerate(
        zip(rows["relay"], rows["pipelined"], ratios, strict=True)
    ):
        print(f"round {index + 1}: relay {relay:,.0f} rows/s, py-amqp pipelined {bare:,.0f}/s, "
              f"{ratio:.2f}")  # fmt: skip
    relay, bare = statistics.median(rows["relay"]), statistics.median(rows["pipelined"])
    print(
        f"median: relay {relay:,.0f} rows/s, py-amqp pipelined {bare:,.0f}/s, "
        f"{relay / bare:.2f}   target >= 0.8x: {'met' if relay / bare >= 0.8 else 'NOT met'}"
    )
    if args.profile:
        for index in range(len(rows["relay"])):
            print(f"\nprofile of relay round {index + 1}:")
            for line in _profile.summary(args.profile / f"relay-{index + 1}.txt", top=25):
                print(line)
    print(json.dumps({"rounds": {k: rows[k] for k in ("relay", "pipelined")},
                      "ratios": [round(r, 3) for r in ratios]}))  # fmt: skip


def latencies(relay: Relay, engine: sa.Engine, task: Any, n: int, rate: float) -> list[float]:
    """Commit-to-publish latency in ms of ``n`` tasks committed at ``rate`` per second."""
    committed: dict[str, float] = {}
    published: dict[str, float] = {}
    original = relay.relay_once

    def timed() -> Any:
        result = original()
        now = time.perf_counter()
        for message_id in result.relayed:
            published[message_id] = now
        return result

    relay.relay_once = timed  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    interval = 1.0 / rate
    next_at = time.perf_counter()
    for i in range(n):
        with Session(engine) as session, session.begin():
            result = outbox.delay(session, task, i)
        committed[result.id] = time.perf_counter()
        next_at += interval
        time.sleep(max(0.0, next_at - time.perf_counter()))
    deadline = time.monotonic() + 30
    while len(published) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(5)
    relay.relay_once = original  # type: ignore[method-assign]
    return [(published[k] - committed[k]) * 1000 for k in committed if k in published]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=400.0, help="tasks/s for the latency")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument(
        "--low-rate",
        type=float,
        default=2.0,
        help="tasks/s where the poll has backed off (NOTIFY's case)",
    )
    parser.add_argument("--notify-only", action="store_true", help="only NOTIFY against polling")
    parser.add_argument("--writers", type=int, default=4, help="concurrent enqueuers")
    parser.add_argument(
        "--ceiling-only",
        action="store_true",
        help="only the relay against the pipelined py-amqp publisher",
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="py-spy the relay's rounds into this directory"
    )
    args = parser.parse_args()

    from celery_beetle.testing.postgres import PostgresServer

    pg = PostgresServer().start()
    try:
        with rabbit_ports(2) as ports:
            url = "beetle://guest:guest@" + ",".join(f"127.0.0.1:{p}" for p in ports) + "//"
            run(url, pg.create_database("bench_outbox"), args, ports)
    finally:
        pg.remove()


def run(url: str, db_url: str, args: argparse.Namespace, ports: list[int]) -> None:
    from celery_beetle.outbox.db import engine_for

    engine = engine_for(db_url, pool_size=max(5, args.writers + 1))
    create_tables(engine)
    ORDERS.metadata.create_all(engine)
    app = make_app(url)
    task = app.tasks["bench.charge"]
    n = args.tasks
    rows: dict[str, list[float]] = {
        k: [] for k in ("plain", "outbox", "direct", "relay", "pipelined")
    }
    with Connection(url) as conn:
        relay = Relay(engine, conn.channel(), batch_size=args.batch_size)
        enqueue_rate(engine, task, 50, True)  # warm up
        relay_rate(relay, engine, task, 50)
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        for index in range(0 if args.notify_only else args.rounds):
            if not args.ceiling_only:
                rows["plain"].append(enqueue_rate(engine, task, n // 3, False))
                rows["outbox"].append(enqueue_rate(engine, task, n // 3, True))
                with engine.begin() as c:  # what the enqueue rounds left
                    c.execute(sa.delete(OUTBOX))
                rows["direct"].append(direct_rate(app, task, n))
            profile = args.profile / f"relay-{index + 1}.txt" if args.profile else None
            rows["relay"].append(relay_rate(relay, engine, task, n, profile))
            rows["pipelined"].append(pipelined_rate(app, ports, n, args.batch_size))
        if args.ceiling_only:
            print_ceiling(rows, args)
            engine.dispose()
            return
        lat = [] if args.notify_only else latencies(relay, engine, task, n, args.rate)
        listening = Relay(engine, conn.channel(), batch_size=args.batch_size, listen=True)
        notify_rows = compare_notify(relay, listening, app, engine, task, args)
    if args.notify_only:
        print_notify(notify_rows, args)
        engine.dispose()
        return
    med = {k: statistics.median(v) for k, v in rows.items()}
    enqueue_ratio = med["plain"] / med["outbox"]
    relay_ratio = med["relay"] / med["direct"]
    print(f"{'':<44}{'baseline':>12}{'outbox':>12}{'ratio':>8}")
    print(f"{'enqueue txn/s (business row [+ outbox row])':<44}"
          f"{med['plain']:>12.0f}{med['outbox']:>12.0f}{enqueue_ratio:>7.2f}x cost")  # fmt: skip
    print(f"{'tasks/s to two brokers (apply_async | relay)':<44}"
          f"{med['direct']:>12.0f}{med['relay']:>12.0f}{relay_ratio:>7.2f}x"
          f"   target >= 3x: {'met' if relay_ratio >= 3 else 'NOT met'}")  # fmt: skip
    ceiling_ratio = med["relay"] / med["pipelined"]
    print(f"{'tasks/s to two brokers (py-amqp pipelined | relay)':<44}"
          f"{med['pipelined']:>12.0f}{med['relay']:>12.0f}{ceiling_ratio:>7.2f}x"
          f"   target >= 0.8x: {'met' if ceiling_ratio >= 0.8 else 'NOT met'}")  # fmt: skip
    print(f"commit-to-publish at {args.rate:.0f}/s: p50 {pct(lat, 0.5):.1f} ms, "
          f"p99 {pct(lat, 0.99):.1f} ms ({len(lat)} of {n} tasks)")  # fmt: skip
    print(json.dumps({"rounds": rows, "enqueue_cost_ratio": round(enqueue_ratio, 2),
                      "relay_vs_direct": round(relay_ratio, 2),
                      "relay_vs_pipelined": round(ceiling_ratio, 2),
                      "latency_p50_ms": round(pct(lat, 0.5), 2),
                      "latency_p99_ms": round(pct(lat, 0.99), 2)}))  # fmt: skip
    print_notify(notify_rows, args)
    engine.dispose()


def compare_notify(
    polling: Relay, listening: Relay, app: Celery, engine: sa.Engine, task: Any, args: Any
) -> dict[str, Any]:
    """The same measurements with and without NOTIFY, rounds interleaved."""
    n, out = args.tasks, {}
    rates: dict[str, list[float]] = {k: [] for k in ("poll1", "notify1", "pollN", "notifyN")}
    for _ in range(args.rounds):
        for notify in (False, True):
            app.conf.beetle_outbox_notify = notify
            side = "notify" if notify else "poll"
            rates[f"{side}1"].append(enqueue_rate(engine, task, n // 3, True))
            rates[f"{side}N"].append(concurrent_enqueue_rate(engine, task, n, args.writers))
            with engine.begin() as c:
                c.execute(sa.delete(OUTBOX))
    out["rates"] = {k: statistics.median(v) for k, v in rates.items()}
    low_count = max(20, int(args.low_rate * 12))
    for label, rate, count in (("steady", args.rate, n), ("low", args.low_rate, low_count)):
        app.conf.beetle_outbox_notify = False
        out[f"poll_{label}"] = latencies(polling, engine, task, count, rate)
        app.conf.beetle_outbox_notify = True
        out[f"notify_{label}"] = latencies(listening, engine, task, count, rate)
    app.conf.beetle_outbox_notify = False
    return out


def print_notify(rows: dict[str, Any], args: Any) -> None:
    rates = rows["rates"]
    print(f"\nNOTIFY wake-ups against polling{'':<14}{'polling':>12}{'NOTIFY':>12}{'ratio':>8}")
    for key, label in (("1", "enqueue txn/s, one writer"),
                       ("N", f"enqueue txn/s, {args.writers} writers")):  # fmt: skip
        poll, notify = rates[f"poll{key}"], rates[f"notify{key}"]
        print(f"{label:<44}{poll:>12.0f}{notify:>12.0f}{poll / notify:>7.2f}x the cost")
    summary: dict[str, Any] = {"enqueue_rates": rates}
    for label, rate in (("steady", args.rate), ("low", args.low_rate)):
        for p in (0.5, 0.99):
            poll, notify = pct(rows[f"poll_{label}"], p), pct(rows[f"notify_{label}"], p)
            name = f"commit-to-publish p{int(p * 100)} at {rate:.0f}/s, ms"
            print(f"{name:<44}{poll:>12.1f}{notify:>12.1f}{poll / notify:>7.2f}x "
                  f"{'shorter' if poll > notify else 'longer'} with NOTIFY")  # fmt: skip
            summary[f"{label}_p{int(p * 100)}_ms"] = {"poll": round(poll, 2),
                                                      "notify": round(notify, 2)}  # fmt: skip
    print(json.dumps({"notify": summary}))


if __name__ == "__main__":
    main()
