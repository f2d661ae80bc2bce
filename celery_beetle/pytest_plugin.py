"""pytest plugin: test your own BeetleTasks against real brokers, under faults.

Installed with ``pip install kombu-beetle[pytest]`` (a ``pytest11`` entry point, so pytest
loads it by itself). Tell it where your app is, in the ini file::

    [pytest]
    beetle_app = myproject.celery:app

(a ``myproject`` beside the ini file is importable without ``pythonpath = .``: the plugin
puts that directory on ``sys.path`` when the package is not importable otherwise), and a
test gets N RabbitMQ nodes behind one ``beetle://`` URL, a dedup Redis and a worker of
your app with ``celery_beetle.install`` applied, all started for it and torn down after::

    def test_charge_runs_once_when_a_broker_dies(beetle_setup):
        for order in range(20):
            charge.delay(order)
        beetle_setup.broker_cluster[0].kill()      # kill -9 one broker mid-run
        beetle_setup.assert_exactly_once(expected=20)

Fixtures (prefixed ``beetle_`` so they sit beside pytest-celery's ``celery_*`` ones):

``beetle_setup``
    A :class:`~celery_beetle.testing.nodes.BeetleTestSetup` (a pytest-celery
    ``CeleryTestSetup``): ``.app``, ``.broker_cluster``, ``.backend`` (the dedup store),
    ``.worker``, ``.trace_dir``, ``.assert_exactly_once()``.
``beetle_broker_cluster``
    The nodes, all up and unfrozen, with a fresh vhost of the test's own
    (:class:`~celery_beetle.testing.nodes.BeetleBrokerCluster`, ``.beetle_url``).
``beetle_store``
    The dedup Redis, running and empty (:class:`~celery_beetle.testing.nodes.BeetleStore`).
``beetle_app``
    Your app, pointed at this test's brokers, store and trace; restored after the test.
``beetle_worker``
    A started worker of your app (:class:`~celery_beetle.testing.nodes.BeetleWorker`);
    ``beetle_worker_factory()`` starts more.
``beetle_trace_dir``
    The test's trace directory (both the publishes and the worker's runs).

Settings you may override as fixtures: ``beetle_app_path`` (else the ``beetle_app`` ini
value), ``beetle_app_conf`` (more ``app.conf`` for both ends), ``beetle_transport_options``
(over short timeouts), ``beetle_worker_options`` (``pool``, ``concurrency``, ``queue``,
``env``, ...);
``beetle_brokers`` (ini, default 2) is how many RabbitMQ nodes the session starts.

Servers run from the installed ``rabbitmq-server`` / ``redis-server`` binaries, or in
containers through testcontainers when a Docker engine answers
(``BEETLE_TEST_SERVERS=auto|local|containers``, see ``celery_beetle.testing.servers``).
The nodes and the store live for the session; each test gets its own vhost and an empty
store, and a node a test killed or froze is brought back before the next.

:May import: ``celery_beetle.testing``
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_beetle.testing import app as apps
from celery_beetle.testing import servers
from celery_beetle.testing.nodes import (
    BeetleBroker,
    BeetleBrokerCluster,
    BeetleStore,
    BeetleStoreCluster,
    BeetleTestSetup,
    BeetleWorker,
    BeetleWorkerCluster,
)
from celery_beetle.testing.rabbit import RabbitNode, start_all
from celery_beetle.testing.redis_server import RedisServer
from celery_beetle.testing.servers import fresh_redis, fresh_vhost
from celery_beetle.testing.worker import WorkerProcess

WORKER_MODULE = "celery_beetle.testing.worker_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "beetle_app",
        "the Celery app the beetle worker runs (package.module:attribute)",
        default="",
    )
    parser.addini(
        "beetle_brokers", "how many RabbitMQ nodes the beetle fixtures start", default="2"
    )


_ADDED_PATH = pytest.StashKey[str]()


def _put_app_root_on_path(config: pytest.Config) -> None:
    """The ini file's directory first on ``sys.path`` when the ``beetle_app`` package sits
    there and is not importable otherwise (what ``pythonpath = .`` does), so that the app
    and the tests importing it load as the README shows. Once; undone at the end."""
    if _ADDED_PATH in config.stash:
        return
    root = config.inipath.parent if config.inipath else config.rootpath
    found = apps.missing_app_root(str(config.getini("beetle_app") or ""), root)
    if found is not None:
        sys.path.insert(0, str(found))
        config.stash[_ADDED_PATH] = str(found)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before the first conftest: one may import the app too."""
    _put_app_root_on_path(early_config)


def pytest_unconfigure(config: pytest.Config) -> None:
    added = config.stash.get(_ADDED_PATH, None)
    if added is not None and added in sys.path:
        sys.path.remove(added)


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config: pytest.Config) -> None:
    """Choose where servers run before any test, so a forced but missing engine stops the run
    (``BEETLE_TEST_SERVERS``; not BEETLE_TEST_BACKEND, the project's test apps' result
    backend). The app's directory goes on ``sys.path`` here too, if a conftest loaded this
    plugin too late for :func:`pytest_load_initial_conftests`."""
    _put_app_root_on_path(config)
    backend, reason = servers.choose_backend()
    message = f"beetle test backend: {backend} ({reason})"
    logging.getLogger("celery_beetle.testing").info(message)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not config.option.collectonly:
        reporter.write_line(message)


# -- servers (session) ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def beetle_broker_count(pytestconfig: pytest.Config) -> int:
    """How many RabbitMQ nodes the session runs (ini ``beetle_brokers``, default 2)."""
    count = int(pytestconfig.getini("beetle_brokers") or 2)
    if count < 2:
        raise pytest.UsageError(f"beetle_brokers = {count}: a beetle:// URL needs two or more")
    return count


@pytest.fixture(scope="session")
def beetle_rabbit_nodes(
    tmp_path_factory: pytest.TempPathFactory, beetle_broker_count: int
) -> Iterator[list[RabbitNode]]:
    """The session's RabbitMQ nodes, started in parallel (~5-10 s), killed at its end."""
    nodes = [
        servers.new_rabbit(tmp_path_factory.mktemp(f"rabbit{i}"))
        for i in range(beetle_broker_count)
    ]
    try:
        start_all(nodes, timeout=servers.start_timeout())
        yield nodes
    finally:
        # Killed, not stopped: their data is thrown away, and a graceful stop costs seconds.
        for node in nodes:
            servers.discard(node)


@pytest.fixture(scope="session")
def beetle_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The session's redis-server (no persistence); never the machine's own Redis."""
    server = servers.new_redis(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
        yield server
    finally:
        servers.discard(server)


# -- per test ------------------------------------------------------------------------------


@pytest.fixture
def beetle_broker_cluster(beetle_rabbit_nodes: list[RabbitNode]) -> Iterator[BeetleBrokerCluster]:
    with fresh_vhost(beetle_rabbit_nodes) as vhost:
        yield BeetleBrokerCluster(*(BeetleBroker(node, vhost) for node in beetle_rabbit_nodes))


@pytest.fixture
def beetle_store(beetle_redis_server: RedisServer) -> BeetleStore:
    return BeetleStore(fresh_redis(beetle_redis_server))


@pytest.fixture
def beetle_trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "beetle-trace"
    path.mkdir()
    return path


@pytest.fixture
def beetle_app_path(pytestconfig: pytest.Config) -> str:
    """Where the app is (``package.module:attribute``): the ini's ``beetle_app``."""
    return str(pytestconfig.getini("beetle_app") or "")


@pytest.fixture
def beetle_app_conf() -> dict[str, Any]:
    """More ``app.conf`` settings for both ends (e.g. ``{"result_backend": ...}``)."""
    return {}


@pytest.fixture
def beetle_transport_options() -> dict[str, Any]:
    """Transport options over the short timeouts the fixtures use (``apps.FAST``)."""
    return {}


@pytest.fixture
def beetle_worker_options() -> dict[str, Any]:
    """``pool`` (solo), ``concurrency`` (1), ``queue`` (the app's default queue), ``root``
    (where the worker runs and imports from: pytest's rootdir), ``env`` (more environment
    variables) and ``extra_args`` (more ``celery worker`` arguments)."""
    return {}


@pytest.fixture
def beetle_app(
    beetle_app_path: str,
    beetle_broker_cluster: BeetleBrokerCluster,
    beetle_store: BeetleStore,
    beetle_trace_dir: Path,
    beetle_transport_options: dict[str, Any],
    beetle_app_conf: dict[str, Any],
) -> Iterator[Celery]:
    """The user's app, configured for this test; its settings are given back after."""
    try:
        app = apps.load_app(beetle_app_path)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    previous = apps.configure(
        app,
        broker_url=beetle_broker_cluster.beetle_url,
        redis_url=beetle_store.url,
        trace_dir=beetle_trace_dir,
        transport_options=beetle_transport_options,
        conf=beetle_app_conf,
    )
    try:
        yield app
    finally:
        apps.restore(app, previous)


@pytest.fixture
def beetle_worker_factory(
    request: pytest.FixtureRequest,
    beetle_app: Celery,
    beetle_app_path: str,
    beetle_broker_cluster: BeetleBrokerCluster,
    beetle_store: BeetleStore,
    beetle_trace_dir: Path,
    beetle_transport_options: dict[str, Any],
    beetle_app_conf: dict[str, Any],
    beetle_worker_options: dict[str, Any],
) -> Iterator[Callable[..., BeetleWorker]]:
    """``beetle_worker_factory(url=None, **options)``: another started worker of the app
    (``url``: a ``beetle://`` URL over some of the nodes; ``options`` over
    ``beetle_worker_options``, ``env`` merged into its); all are killed after the test."""
    started: list[BeetleWorker] = []

    def make(url: str | None = None, **options: Any) -> BeetleWorker:
        more_env = {**beetle_worker_options.get("env", {}), **options.get("env", {})}
        options = {**beetle_worker_options, **options, "env": more_env}
        queue = options.pop("queue", None) or beetle_app.conf.task_default_queue
        root = Path(options.pop("root", None) or request.config.rootpath)
        env = apps.worker_env(
            beetle_app_path,
            broker_url=url or beetle_broker_cluster.beetle_url,
            redis_url=beetle_store.url,
            trace_dir=beetle_trace_dir,
            transport_options=beetle_transport_options,
            conf=beetle_app_conf,
        )
        env.update(options.pop("env"))
        log = beetle_trace_dir.parent / f"beetle-worker{len(started)}.log"
        process = WorkerProcess(
            WORKER_MODULE,
            log,
            env,
            pool=options.pop("pool", "solo"),
            concurrency=int(options.pop("concurrency", 1)),
            queue=queue,
            name=f"beetle{len(started)}",
            extra_args=("--without-heartbeat", *options.pop("extra_args", ())),
            root=root,
        )
        if options:
            raise TypeError(f"unknown beetle worker options: {sorted(options)}")
        worker = BeetleWorker(process, beetle_app, beetle_trace_dir, queue)
        started.append(worker)
        process.start()
        return worker

    yield make
    for worker in started:
        worker.teardown()


@pytest.fixture
def beetle_worker(beetle_worker_factory: Callable[..., BeetleWorker]) -> BeetleWorker:
    return beetle_worker_factory()


@pytest.fixture
def beetle_setup(
    beetle_worker: BeetleWorker,
    beetle_broker_cluster: BeetleBrokerCluster,
    beetle_store: BeetleStore,
    beetle_app: Celery,
    beetle_trace_dir: Path,
) -> Iterator[BeetleTestSetup]:
    """Brokers, the dedup store, a started worker and the app, as one pytest-celery setup."""
    setup = BeetleTestSetup(
        worker_cluster=BeetleWorkerCluster(beetle_worker),
        broker_cluster=beetle_broker_cluster,
        backend_cluster=BeetleStoreCluster(beetle_store),
        app=beetle_app,
        trace_dir=beetle_trace_dir,
    )
    assert setup.ready(), f"not ready: {setup.brokers.brokers}, {setup.store}, {beetle_worker}"
    yield setup
    setup.teardown()
