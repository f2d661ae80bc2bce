"""Project-wide fixtures: real RabbitMQ nodes, Redis servers and TCP proxies, started locally.

- `rabbit_nodes` (session): three `RabbitNode`s started in parallel, killed at session end.
- `brokers`: every node running and unpaused, a fresh vhost on each; yields a `BrokerSet`
  (`.nodes`, `.vhost`, `.beetle_url`, `.url_for(*indexes)`); the vhost is deleted after.
- `redis_server` (session): one `RedisServer`; `redis_url`: its URL with the db flushed.
- `redis_aof`: a fresh `RedisServer` with appendonly, for kill -9 and restart tests.
- `redis_sentinel`: a fresh `SentinelSet` (master, replica, Sentinel), for failover tests.
- `tcp_proxy`: a factory, `tcp_proxy(node)` -> a started `TcpProxy` in front of that node.

Servers come from the installed binaries; a missing binary skips the test locally and fails it
under `CI=true`, so CI cannot go green by skipping. Containers (testcontainers) are not used yet:
the fixtures need pids to SIGKILL and SIGSTOP, which a container would have to map to
`docker kill` / `docker pause`.

Tests under tests/integration and tests/chaos get the `integration` / `chaos` markers from their
path; tests marked `soak` run only with `--soak`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.harness import (
    BrokerSet,
    RabbitNode,
    RabbitNodeError,
    RedisServer,
    TcpProxy,
    rabbitmq_server_binary,
    redis_server_binary,
    start_all,
)
from tests.harness.sentinel import SentinelSet

NODE_COUNT = 3
TEST_VHOST_PREFIX = "test-"
_TESTS_DIR = Path(__file__).parent
_MARKERS_BY_DIR = {"integration": pytest.mark.integration, "chaos": pytest.mark.chaos}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak", action="store_true", default=False, help="also run long tests marked soak"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_soak = config.getoption("--soak")
    for item in items:
        path = Path(item.path)
        if path.is_relative_to(_TESTS_DIR):
            top = path.relative_to(_TESTS_DIR).parts[0]
            if top in _MARKERS_BY_DIR:
                item.add_marker(_MARKERS_BY_DIR[top])
        if "soak" in item.keywords and not run_soak:
            item.add_marker(pytest.mark.skip(reason="soak test: run with --soak"))


def _server_missing(what: str) -> None:
    message = f"{what} is not installed; integration tests need it"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: install it rather than skip)", pytrace=False)
    pytest.skip(message)


# -- Spark (the audit) --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the run (a JVM costs seconds): audit tests and chaos."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        _server_missing("pyspark")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        _server_missing("a Java runtime (java on PATH or JAVA_HOME)")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("beetle-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# -- RabbitMQ ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rabbit_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RabbitNode]]:
    """Three independent brokers for the whole session (they boot in ~5-10 s together)."""
    if rabbitmq_server_binary() is None:
        _server_missing("rabbitmq-server")
    nodes = [RabbitNode(tmp_path_factory.mktemp(f"rabbit{i}")) for i in range(NODE_COUNT)]
    start_all(nodes)
    yield nodes
    # Killed, not stopped: their data is thrown away, and a graceful stop costs seconds.
    for node in nodes:
        node.kill()


@pytest.fixture
def brokers(rabbit_nodes: list[RabbitNode]) -> Iterator[BrokerSet]:
    """All nodes up, with a vhost of this test's own, so no test sees another's queues."""
    for node in rabbit_nodes:
        if node.is_paused:
            node.resume()
    dead = [node for node in rabbit_nodes if not node.is_running]
    start_all(dead)
    for node in dead:  # a test that killed it could not clean up its vhost
        for vhost in node.vhosts():
            if vhost.startswith(TEST_VHOST_PREFIX):
                node.delete_vhost(vhost)
    vhost = f"{TEST_VHOST_PREFIX}{uuid.uuid4().hex[:12]}"
    for node in rabbit_nodes:
        node.create_vhost(vhost)
    yield BrokerSet(nodes=list(rabbit_nodes), vhost=vhost)
    for node in rabbit_nodes:
        if node.is_paused:
            node.resume()
        if node.is_running:
            with contextlib.suppress(RabbitNodeError, OSError):
                node.delete_vhost(vhost)


# -- Redis -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server without persistence for the session; never the machine's own Redis."""
    if redis_server_binary() is None:
        _server_missing("redis-server")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, running, unpaused and with an empty database."""
    if redis_server.is_paused:
        redis_server.resume()
    if not redis_server.is_running:
        redis_server.start()
    with redis_server.client() as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def redis_aof(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server that fsyncs every write to its AOF, so a kill -9 loses nothing."""
    if redis_server_binary() is None:
        _server_missing("redis-server")
    server = RedisServer(tmp_path / "redis-aof", appendonly=True)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def redis_sentinel(tmp_path: Path) -> Iterator[SentinelSet]:
    """A fresh master, replica and Sentinel that fails over about 3-4 s after a kill -9."""
    if redis_server_binary() is None:
        _server_missing("redis-server")
    trio = SentinelSet(tmp_path / "redis-sentinel")
    try:
        trio.start()
        yield trio
    finally:
        trio.stop()


# -- network faults ----------------------------------------------------------------------------


class _Server(Protocol):
    host: str
    port: int


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[_Server], TcpProxy]]:
    """`tcp_proxy(node)` starts a proxy in front of a node (or Redis); all are closed after."""
    proxies: list[TcpProxy] = []

    def make(server: _Server) -> TcpProxy:
        proxy = TcpProxy(server.host, server.port).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()
