"""A local RabbitMQ cluster for a benchmark: what a team would run instead of beetle.

Three throwaway nodes (each its own node name, ports, mnesia dir and HOME) share one Erlang
cookie; the second and third join the first (``stop_app``, ``join_cluster``, ``start_app``).
A quorum queue declared on it then has a replica on every node, so a broker machine can die
without losing a confirmed task. All three run on this machine's cores, which a real cluster
spreads over three machines."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator

from celery_beetle.testing.rabbit import RabbitNode, RabbitNodeError, start_all, stop_all


def _share_cookie(nodes: list[RabbitNode]) -> None:
    """The same Erlang cookie in every node's HOME (rabbitmqctl reads it there too)."""
    cookie = secrets.token_hex(16).upper()
    for node in nodes:
        path = node.base_dir / "home" / ".erlang.cookie"
        path.write_text(cookie)
        path.chmod(0o400)


def _join(node: RabbitNode, seed: RabbitNode) -> None:
    node.ctl("stop_app")
    node.ctl("join_cluster", seed.nodename)
    node.ctl("start_app")
    deadline = time.monotonic() + 60
    while not node._accepts_amqp():  # start_app returns before the listener is back
        if time.monotonic() > deadline:
            raise RabbitNodeError(f"{node.nodename} did not accept AMQP after joining")
        time.sleep(0.1)


@contextlib.contextmanager
def rabbit_cluster(size: int = 3) -> Iterator[list[RabbitNode]]:
    """Yield ``size`` running nodes clustered together (the first is the seed)."""
    nodes = [RabbitNode(management=False) for _ in range(size)]
    _share_cookie(nodes)
    try:
        start_all(nodes)
        for node in nodes[1:]:
            _join(node, nodes[0])
        running = nodes[0].ctl("cluster_status", "--formatter", "json")
        if running.count("@localhost") < 2 * size:  # disc nodes and running nodes
            raise RabbitNodeError(f"cluster did not form: {running[:500]}")
        yield nodes
    finally:
        stop_all(nodes)
        for node in nodes:
            node.remove()


def failover_url(nodes: list[RabbitNode]) -> str:
    """A pyamqp URL listing every node (Celery's failover order: the first, then the next)."""
    return ";".join(f"pyamqp://guest:guest@{node.host_port}//" for node in nodes)
