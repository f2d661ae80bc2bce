"""The servers, and one suite run under each transport on them.

Two RabbitMQ nodes and, for each transport, a Redis of its own (the result backend in
db 0, the dedup store in db 1), so that the two runs of a suite may go at once without
reading each other's keys. Each run gets a fresh vhost; the suite's session worker is
Celery's in-process test worker, as in Celery's own CI.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from celery_beetle.testing.conformance.overrides import STORE_ENV
from celery_beetle.testing.conformance.results import Outcome, read_junit
from celery_beetle.testing.rabbit import RabbitNode, beetle_url, start_all, stop_all
from celery_beetle.testing.redis_server import RedisServer

__all__ = ["TRANSPORTS", "Run", "Servers", "run_suite", "running_servers"]

#: the baseline first: plain Celery over one broker, then every task a BeetleTask over two
TRANSPORTS = ("pyamqp", "beetle")
#: a test without a timeout marker of its own gives up after this long, so nothing hangs
DEFAULT_TIMEOUT_S = 300


@dataclass
class Run:
    """One suite's run under one transport."""

    transport: str
    outcomes: dict[str, Outcome]
    seconds: float
    log: Path


class Servers:
    """Two RabbitMQ nodes and a Redis per transport, started together, killed by pid."""

    def __init__(self, base: Path) -> None:
        self.nodes = [RabbitNode(base / f"rabbit{i}") for i in range(2)]
        self.redis = {name: RedisServer(base / f"redis-{name}") for name in TRANSPORTS}

    def start(self) -> Servers:
        start_all(self.nodes)
        for server in self.redis.values():
            server.start()
        return self

    def stop(self) -> None:
        stop_all(self.nodes)
        for server in self.redis.values():
            server.stop()

    def environment(self, transport: str) -> dict[str, str]:
        """What Celery's suite reads (``TEST_BROKER``, ``TEST_BACKEND``, ``REDIS_*``) and
        our conftest reads (the dedup store), on a fresh vhost and an empty Redis."""
        vhost = f"conformance-{transport}-{uuid.uuid4().hex[:8]}"
        redis = self.redis[transport]
        with redis.client() as client:
            client.flushall()
        env = {"TEST_BACKEND": redis.url, "REDIS_HOST": redis.host, "REDIS_PORT": str(redis.port)}
        if transport == "beetle":
            for node in self.nodes:
                node.create_vhost(vhost)
            env["TEST_BROKER"] = beetle_url([node.host_port for node in self.nodes], vhost)
            env[STORE_ENV] = f"redis://{redis.host_port}/1"
        else:
            self.nodes[0].create_vhost(vhost)
            env["TEST_BROKER"] = self.nodes[0].amqp_url(vhost).replace("amqp://", "pyamqp://", 1)
        return env

    def kombu_environment(self, transport: str) -> dict[str, str]:
        """What kombu's ``test_py_amqp.py`` reads: one broker's port, or, for its beetle
        copy (:mod:`.kombu`), both brokers' addresses after the first host."""
        first, second = self.nodes
        port = str(first.port)
        if transport == "beetle":
            port = f"{first.port},{second.host_port}"
        return {"RABBITMQ_HOST": first.host, "RABBITMQ_5672_TCP": port}


@contextlib.contextmanager
def running_servers(base: Path) -> Iterator[Servers]:
    started = Servers(base)
    try:
        yield started.start()
    finally:
        started.stop()


def run_suite(
    trees: Mapping[str, Path],
    files: Sequence[str],
    environment: Callable[[str], dict[str, str]],
    out: Path,
    *,
    select: str | None = None,
    parallel: bool = False,
) -> dict[str, Run]:
    """Run ``files`` of the suite under each transport, in its tree (``trees[transport]``)
    and ``environment(transport)``; all at once with ``parallel``."""
    out.mkdir(parents=True, exist_ok=True)

    def one(transport: str) -> Run:
        tree = trees[transport]
        return _run(tree, files, environment(transport), out, transport, select)

    with ThreadPoolExecutor(max_workers=len(trees) if parallel else 1) as pool:
        return dict(zip(trees, pool.map(one, trees), strict=True))


def _run(
    tree: Path,
    files: Sequence[str],
    env: dict[str, str],
    out: Path,
    transport: str,
    select: str | None,
) -> Run:
    stem = f"{tree.name}-{Path(files[0]).stem}-{transport}"
    junit, log = out / f"{stem}.xml", out / f"{stem}.log"
    command = [
        sys.executable, "-m", "pytest", *files, "-p", "no:cacheprovider",
        "-p", "no:celery_beetle.pytest_plugin", "-o", f"timeout={DEFAULT_TIMEOUT_S}",
        "-q", "-rfE", f"--junitxml={junit}",
    ]  # fmt: skip
    if select:
        command += ["-k", select]
    started = time.monotonic()
    with log.open("w") as output:
        subprocess.run(
            command, cwd=tree, env={**os.environ, **env}, stdout=output, stderr=subprocess.STDOUT
        )
    seconds = time.monotonic() - started
    outcomes = read_junit(junit) if junit.exists() else {}
    return Run(transport, outcomes, seconds, log)
