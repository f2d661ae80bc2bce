"""Project-wide fixtures: real RabbitMQ nodes, Redis servers and TCP proxies, started locally.

- `rabbit_nodes` (session): three `RabbitNode`s started in parallel, killed at session end.
- `brokers`: every node running and unpaused, a fresh vhost on each; yields a `BrokerSet`
  (`.nodes`, `.vhost`, `.beetle_url`, `.url_for(*indexes)`); the vhost is deleted after.
- `redis_server` (session): one `RedisServer`; `redis_url`: its URL with the db flushed.
- `redis_aof`: a fresh `RedisServer` with appendonly, for kill -9 and restart tests.
- `redis_own`: a fresh redis-server without persistence, for tests that kill or freeze it.
- `redis_sentinel`: a fresh `SentinelSet` (master, replica, Sentinel), for failover tests.
- `tcp_proxy`: a factory, `tcp_proxy(node)` -> a started `TcpProxy` in front of that node.

Where the servers run, chosen once per session and named at its start (`BEETLE_TEST_SERVERS`,
not BEETLE_TEST_BACKEND: that one is the test apps' Celery result backend):
- containers (tests/harness/containers.py, testcontainers) when a Docker engine answers a ping
  within a second and has or can pull the images; `BEETLE_TEST_SERVERS=containers` insists on
  it and stops the run if either is missing.
  kill is `docker kill`, pause is `docker pause`, restart starts the same container again.
- local otherwise, or with `BEETLE_TEST_SERVERS=local`: the installed binaries; a missing binary
  skips the test locally and fails it under `CI=true`, so CI cannot go green by skipping.
`redis_sentinel` and tests that build a `RedisServer` themselves always run local binaries.

Tests under tests/integration and tests/chaos get the `integration` / `chaos` markers from their
path; tests marked `soak` run only with `--soak`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

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

if TYPE_CHECKING:
    from tests.harness.containers import RabbitContainer, RedisContainer

NODE_COUNT = 3
#: seconds for a node to answer: ~5 s locally; a container's first boot also unpacks its image
LOCAL_START_TIMEOUT, CONTAINER_START_TIMEOUT = 60, 120
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


# -- backend: local binaries or containers ------------------------------------------------------

BACKENDS = ("auto", "local", "containers")
_backend: str | None = None


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config: pytest.Config) -> None:
    """Choose the backend before any test runs, so a forced but missing engine stops the run."""
    global _backend
    wanted = os.environ.get("BEETLE_TEST_SERVERS", "auto").strip().lower() or "auto"
    if wanted not in BACKENDS:
        raise pytest.UsageError(f"BEETLE_TEST_SERVERS={wanted!r}: expected one of {BACKENDS}")
    _backend, reason = _choose_backend(wanted)
    message = f"beetle test backend: {_backend} ({reason})"
    logging.getLogger("tests").info(message)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not config.option.collectonly:
        reporter.write_line(message)


def _choose_backend(wanted: str) -> tuple[str, str]:
    if wanted == "local":
        return "local", "BEETLE_TEST_SERVERS=local"
    try:
        from tests.harness.containers import (
            RABBITMQ_IMAGE,
            REDIS_IMAGE,
            docker_engine,
            missing_images,
            prepare_engine,
        )
    except ImportError as exc:  # testcontainers / docker not installed
        if wanted == "containers":
            raise pytest.UsageError(f"BEETLE_TEST_SERVERS=containers, but {exc}")
        return "local", f"no testcontainers: {exc.name}"
    engine = docker_engine(timeout=1.0)
    if engine is None:
        if wanted == "containers":
            raise pytest.UsageError(
                "BEETLE_TEST_SERVERS=containers, but no Docker engine answers "
                f"(DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')})"
            )
        return "local", "no Docker engine answers"
    missing = missing_images(engine)
    if missing:
        engine.close()
        what = f"a Docker engine answers, but cannot pull {', '.join(missing)}"
        if wanted == "containers":
            raise pytest.UsageError(f"BEETLE_TEST_SERVERS=containers: {what}")
        return "local", what
    note = prepare_engine(engine)
    engine.close()
    return "containers", "; ".join(filter(None, [f"{RABBITMQ_IMAGE}, {REDIS_IMAGE}", note]))


def _use_containers() -> bool:
    return _backend == "containers"


def _start_timeout() -> float:
    return CONTAINER_START_TIMEOUT if _use_containers() else LOCAL_START_TIMEOUT


def _new_rabbit(base_dir: Path) -> RabbitNode:
    if _use_containers():
        from tests.harness.containers import RabbitContainer

        return RabbitContainer(base_dir)
    if rabbitmq_server_binary() is None:
        _server_missing("rabbitmq-server")
    return RabbitNode(base_dir)


def _new_redis(base_dir: Path, *, appendonly: bool = False) -> RedisServer:
    if _use_containers():
        from tests.harness.containers import RedisContainer

        return RedisContainer(base_dir, appendonly=appendonly)
    if redis_server_binary() is None:
        _server_missing("redis-server")
    return RedisServer(base_dir, appendonly=appendonly)


def _discard(server: RabbitNode | RedisServer) -> None:
    """Kill a server whose data is thrown away; a container is removed with its data, too."""
    if _use_containers():
        cast("RabbitContainer | RedisContainer", server).remove()
    else:
        server.kill()


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
    nodes = [_new_rabbit(tmp_path_factory.mktemp(f"rabbit{i}")) for i in range(NODE_COUNT)]
    try:
        start_all(nodes, timeout=_start_timeout())
        yield nodes
    finally:
        # Killed, not stopped: their data is thrown away, and a graceful stop costs seconds.
        for node in nodes:
            _discard(node)


@pytest.fixture
def brokers(rabbit_nodes: list[RabbitNode]) -> Iterator[BrokerSet]:
    """All nodes up, with a vhost of this test's own, so no test sees another's queues."""
    for node in rabbit_nodes:
        if node.is_paused:
            node.resume()
    dead = [node for node in rabbit_nodes if not node.is_running]
    start_all(dead, timeout=_start_timeout())
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
    server = _new_redis(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
        yield server
    finally:
        _discard(server)


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
