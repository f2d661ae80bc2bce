"""Project-wide fixtures: real RabbitMQ nodes, Redis servers and TCP proxies, started locally.

- `rabbit_nodes` (session): three `RabbitNode`s started in parallel, killed at session end.
- `brokers`: every node running and unpaused, a fresh vhost on each; yields a `BrokerSet`
  (`.nodes`, `.vhost`, `.beetle_url`, `.url_for(*indexes)`); the vhost is deleted after.
- `redis_server` (session): one `RedisServer`; `redis_url`: its URL with the db flushed.
- `redis_aof`: a fresh `RedisServer` with appendonly, for kill -9 and restart tests.
- `redis_own`: a fresh redis-server without persistence, for tests that kill or freeze it.
- `redis_sentinel`: a fresh `SentinelSet` (master, replica, Sentinel), for failover tests.
- `tcp_proxy`: a factory, `tcp_proxy(node)` -> a started `TcpProxy` in front of that node.

The servers and the fixtures `rabbit_nodes`, `brokers`, `redis_server` and `redis_url` build on
are the pytest plugin's (`celery_beetle.pytest_plugin`, what users test their own tasks with),
so there is one implementation and the suite exercises it. Where the servers run, chosen once
per session by the plugin and named at its start (`BEETLE_TEST_SERVERS`, not
BEETLE_TEST_BACKEND: that one is the test apps' Celery result backend):
- containers (celery_beetle/testing/containers.py, testcontainers) when a Docker engine answers
  a ping within a second and has or can pull the images; `BEETLE_TEST_SERVERS=containers` insists on
  it and stops the run if either is missing.
  kill is `docker kill`, pause is `docker pause`, restart starts the same container again.
- local otherwise, or with `BEETLE_TEST_SERVERS=local`: the installed binaries; a missing binary
  skips the test locally and fails it under `CI=true`, so CI cannot go green by skipping.
`redis_sentinel` and tests that build a `RedisServer` themselves always run local binaries.

Tests under tests/integration and tests/chaos get the `integration` / `chaos` markers from their
path; tests marked `soak` run only with `--soak`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from celery_beetle.testing import servers
from celery_beetle.testing.proxy import TcpProxy
from celery_beetle.testing.rabbit import BrokerSet, RabbitNode
from celery_beetle.testing.redis_server import RedisServer, redis_server_binary
from celery_beetle.testing.sentinel import SentinelSet
from celery_beetle.testing.servers import fresh_redis, fresh_vhost

#: the fixtures of the plugin users get (celery_beetle.pytest_plugin); the project's own
#: build on them, so the suite exercises them. Registered once, whether or not the entry
#: point (named after the module) is installed too.
pytest_plugins = ["celery_beetle.pytest_plugin"]

NODE_COUNT = 3
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


# -- backend: local binaries or containers ------------------------------------------------------
# Chosen by the plugin (celery_beetle.testing.servers) at configure time; one implementation.

_use_containers = servers.use_containers
_start_timeout = servers.start_timeout
_new_rabbit = servers.new_rabbit
_new_redis = servers.new_redis
_discard = servers.discard
_server_missing = servers.server_missing


# -- Spark (the audit) --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the run (a JVM costs seconds): audit tests and chaos."""
    try:
        from pyspark.sql import SparkSession

        from celery_beetle.audit import class_cache
    except ImportError:
        _server_missing("pyspark")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        _server_missing("a Java runtime (java on PATH or JAVA_HOME)")
    from celery_beetle.audit import quiet

    quiet.local_environment()  # the Python workers on this interpreter, as the audit's own
    session = (
        SparkSession.builder.master("local[2]")
        .appName("beetle-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.memory", "1g")
        # Spark's classes from the archive scripts/setup-env builds, when it is there
        .config("spark.driver.extraJavaOptions", class_cache.java_options(write=False))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# -- RabbitMQ ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rabbit_nodes(beetle_rabbit_nodes: list[RabbitNode]) -> list[RabbitNode]:
    """The plugin's session nodes (``beetle_brokers = 3`` in setup.cfg): one set for the
    project's tests and the plugin's users (examples/) alike."""
    assert len(beetle_rabbit_nodes) == NODE_COUNT, "setup.cfg: beetle_brokers = 3"
    return beetle_rabbit_nodes


@pytest.fixture
def brokers(rabbit_nodes: list[RabbitNode]) -> Iterator[BrokerSet]:
    """All nodes up, with a vhost of this test's own, so no test sees another's queues."""
    with fresh_vhost(rabbit_nodes) as vhost:
        yield BrokerSet(nodes=list(rabbit_nodes), vhost=vhost)


# -- Redis -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(beetle_redis_server: RedisServer) -> RedisServer:
    """The plugin's session redis-server, without persistence; never the machine's own."""
    return beetle_redis_server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, running, unpaused and with an empty database."""
    return fresh_redis(redis_server).url


@pytest.fixture
def redis_aof(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server that fsyncs every write to its AOF, so a kill -9 loses nothing."""
    yield from _fresh_redis(tmp_path / "redis-aof", appendonly=True)


@pytest.fixture
def redis_own(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server without persistence that the test alone kills or freezes."""
    yield from _fresh_redis(tmp_path / "redis-own")


def _fresh_redis(base_dir: Path, *, appendonly: bool = False) -> Iterator[RedisServer]:
    server = _new_redis(base_dir, appendonly=appendonly)
    try:
        server.start()
        yield server
    finally:
        _discard(server)


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
