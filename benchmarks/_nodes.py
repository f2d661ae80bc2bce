"""Brokers for a benchmark run: local throwaway nodes unless BEETLE_BENCH_PORTS names some."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@contextlib.contextmanager
def rabbit_ports(count: int) -> Iterator[list[int]]:
    """Yield AMQP ports of ``count`` brokers (guest/guest on 127.0.0.1)."""
    given = os.environ.get("BEETLE_BENCH_PORTS")
    if given:
        ports = [int(p) for p in given.split(",")]
        if len(ports) < count:
            raise SystemExit(f"BEETLE_BENCH_PORTS lists {len(ports)} brokers, {count} needed")
        yield ports[:count]
        return
    from celery_beetle.testing.rabbit import RabbitNode, start_all, stop_all

    nodes = [RabbitNode(management=False) for _ in range(count)]
    start_all(nodes)
    try:
        yield [node.port for node in nodes]
    finally:
        stop_all(nodes)
        for node in nodes:
            node.remove()
