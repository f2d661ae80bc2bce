"""Redundant confirmed publishing over beetle:// against one broker on pyamqp.

Both sides publish the same Celery task with ``apply_async`` and publisher
confirms; the beetle side writes every message to two brokers.  Rounds are
interleaved so that both sides see the same machine load.  Target: ratio >= 0.9
(sequential publishing to two brokers measures about 0.5).

    python -m benchmarks.bench_publish [--tasks 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

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
        }
        for _ in range(args.rounds):
            rates["pyamqp, 1 broker"].append(publish_rate(baseline, args.tasks))
            purge(baseline)
            rates["beetle, 2 copies"].append(publish_rate(beetle, args.tasks))
            purge(beetle)
            rates["naive, 2 in a row"].append(sequential_rate(baseline, second, args.tasks))
            purge(baseline)
            purge(second)
        print(f"confirmed apply_async, {args.tasks} tasks x {args.rounds} rounds (median)")
        medians = {name: statistics.median(values) for name, values in rates.items()}
        for name, rate in medians.items():
            print(f"  {name:<20} {rate:10.0f} tasks/s")
        ratio = medians["beetle, 2 copies"] / medians["pyamqp, 1 broker"]
        naive = medians["naive, 2 in a row"] / medians["pyamqp, 1 broker"]
        verdict = "meets" if ratio >= 0.9 else "misses"
        print(f"  ratio beetle/pyamqp  {ratio:10.2f}   (target >= 0.9: {verdict})")
        print(f"  ratio naive/pyamqp   {naive:10.2f}   (both copies one after the other)")


if __name__ == "__main__":
    main()
