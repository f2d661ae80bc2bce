"""Redundant confirmed publishing over beetle:// against one broker on pyamqp.

Both sides publish the same Celery task with ``apply_async`` and publisher
confirms; the beetle side writes every message to two brokers.  Rounds are
interleaved so that both sides see the same machine load.  Target: ratio >= 0.9
(sequential publishing to two brokers measures about 0.5).

A last pair of rows takes Celery and beetle away: bare py-amqp publishing to one
broker, and to two brokers in parallel.  Their ratio is the ceiling for any
redundant publisher on this machine, where both brokers and the client share the
same cores (on separate machines each broker has its own).

    python -m benchmarks.bench_publish [--tasks 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import amqp
from amqp import spec
from celery import Celery

import kombu_beetle  # noqa: F401  (registers beetle://)
from benchmarks._nodes import rabbit_ports


def make_app(url: str, transport_options: dict) -> Celery:
    app = Celery("bench", broker=url, set_as_current=False)
    app.conf.broker_transport_options = transport_options
    app.conf.task_default_queue = "bench"

    @app.task(name="bench.noop", shared=False)
    def noop(i: int) -> int:
        return i

    return app


def publish_rate(app: Celery, tasks: int) -> float:
    task = app.tasks["bench.noop"]
    with app.producer_or_acquire() as producer:
        task.apply_async((0,), producer=producer)  # declare and warm up
        started = time.perf_counter()
        for i in range(tasks):
            task.apply_async((i,), producer=producer)
        return tasks / (time.perf_counter() - started)


def sequential_rate(first: Celery, second: Celery, tasks: int) -> float:
    """Naive redundancy: each task to one broker, confirmed, then to the other, confirmed."""
    one, two = first.tasks["bench.noop"], second.tasks["bench.noop"]
    with first.producer_or_acquire() as p1, second.producer_or_acquire() as p2:
        one.apply_async((0,), producer=p1)
        two.apply_async((0,), producer=p2)
        started = time.perf_counter()
        for i in range(tasks):
            one.apply_async((i,), producer=p1)
            two.apply_async((i,), producer=p2)
        return tasks / (time.perf_counter() - started)


def raw_rates(app: Celery, ports: list[int], tasks: int) -> tuple[float, float]:
    """What the machine allows without Celery or beetle: bare py-amqp confirmed publishes of
    a Celery-sized message to one broker, and to two brokers written in parallel (both
    writes, then both confirms: what beetle does). Their ratio is the ceiling for beetle's."""
    connections = [amqp.Connection(f"127.0.0.1:{port}") for port in ports]
    channels = []
    for connection in connections:
        connection.connect()
        channel = connection.channel()
        channel.confirm_select()
        channel.queue_declare("bench-raw", durable=True, auto_delete=False)
        channels.append(channel)
    # the same headers and body as apply_async((0,)) puts on the wire
    task = app.amqp.as_task_v2("00000000-0000-0000-0000-000000000000", "bench.noop", args=(0,))
    body = json.dumps(task.body).encode()
    headers = {k: v for k, v in task.headers.items() if v is not None}

    def rate(targets: list[Any]) -> float:
        started = time.perf_counter()
        for _ in range(tasks):
            for channel in targets:
                message = amqp.Message(
                    body,
                    delivery_mode=2,
                    content_type="application/json",
                    content_encoding="utf-8",
                    application_headers=headers,
                )
                channel.basic_publish(message, routing_key="bench-raw")
            for channel in targets:
                channel.wait([spec.Basic.Ack, spec.Basic.Nack])
        return tasks / (time.perf_counter() - started)

    try:
        return rate(channels[:1]), rate(channels)
    finally:
        for channel in channels:
            channel.queue_delete("bench-raw")
        for connection in connections:
            connection.close()


def purge(app: Celery) -> None:
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with rabbit_ports(2) as (p1, p2):
        baseline = make_app(f"pyamqp://guest:guest@127.0.0.1:{p1}//", {"confirm_publish": True})
        beetle = make_app(
            f"beetle://guest:guest@127.0.0.1:{p1},127.0.0.1:{p2}//",
            {"redundant_queues": "bench"},
        )
        second = make_app(f"pyamqp://guest:guest@127.0.0.1:{p2}//", {"confirm_publish": True})
        rates: dict[str, list[float]] = {
            "pyamqp, 1 broker": [],
            "beetle, 2 copies": [],
            "naive, 2 in a row": [],
            "raw py-amqp, 1 broker": [],
            "raw py-amqp, 2 brokers": [],
        }
        for _ in range(args.rounds):
            rates["pyamqp, 1 broker"].append(publish_rate(baseline, args.tasks))
            purge(baseline)
            rates["beetle, 2 copies"].append(publish_rate(beetle, args.tasks))
            purge(beetle)
            rates["naive, 2 in a row"].append(sequential_rate(baseline, second, args.tasks))
            purge(baseline)
            purge(second)
            one, two = raw_rates(baseline, [p1, p2], args.tasks)
            rates["raw py-amqp, 1 broker"].append(one)
            rates["raw py-amqp, 2 brokers"].append(two)
        print(f"confirmed apply_async, {args.tasks} tasks x {args.rounds} rounds (median)")
        medians = {name: statistics.median(values) for name, values in rates.items()}
        for name, rate in medians.items():
            print(f"  {name:<20} {rate:10.0f} tasks/s")
        ratio = medians["beetle, 2 copies"] / medians["pyamqp, 1 broker"]
        naive = medians["naive, 2 in a row"] / medians["pyamqp, 1 broker"]
        verdict = "meets" if ratio >= 0.9 else "misses"
        print(f"  ratio beetle/pyamqp  {ratio:10.2f}   (target >= 0.9: {verdict})")
        print(f"  ratio naive/pyamqp   {naive:10.2f}   (both copies one after the other)")
        ceiling = medians["raw py-amqp, 2 brokers"] / medians["raw py-amqp, 1 broker"]
        print(
            f"  ceiling, raw 2/1     {ceiling:10.2f}   (bare py-amqp, both writes then both "
            "confirms: what this machine allows)"
        )
        print(
            f"  beetle / ceiling     {ratio / ceiling:10.2f}   ((beetle/pyamqp) / (raw 2/1); "
            "target >= 0.95)"
        )
        # what beetle adds per message beyond the bare parallel publish, once Celery's own
        # cost (apply_async over bare py-amqp, one broker) is taken out of both sides
        celery_us = 1e6 / medians["pyamqp, 1 broker"] - 1e6 / medians["raw py-amqp, 1 broker"]
        beetle_us = 1e6 / medians["beetle, 2 copies"] - 1e6 / medians["raw py-amqp, 2 brokers"]
        print(
            f"  beetle's own cost    {beetle_us - celery_us:10.0f} us per message, beyond the "
            "bare parallel publish and Celery"
        )


if __name__ == "__main__":
    main()
