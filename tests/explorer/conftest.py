"""The fault explorer's tests: one set of servers (three RabbitMQ nodes, Redis, PostgreSQL
when a scenario has inbox tasks) for every scenario of the session, as ``scripts/explore``
does; each scenario gets a fresh vhost, an empty Redis and a database of its own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_beetle.testing import servers
from celery_beetle.testing.explorer.runner import Cluster
from celery_beetle.testing.rabbit import rabbitmq_server_binary
from celery_beetle.testing.redis_server import redis_server_binary


@pytest.fixture(scope="session")
def explorer_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if rabbitmq_server_binary() is None:
        servers.server_missing("rabbitmq-server")
    if redis_server_binary() is None:
        servers.server_missing("redis-server")
    cluster = Cluster(Path(tmp_path_factory.mktemp("explorer-servers")))
    try:
        yield cluster.start()
    finally:
        cluster.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "explorer: the fault explorer's seeded scenarios on real servers"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The seeded scenarios run with the suite (about 10 minutes); ``BEETLE_EXPLORE=0``
    leaves them out of a local run."""
    if os.environ.get("BEETLE_EXPLORE", "1") != "0":
        return
    here = Path(__file__).parent
    keep = [item for item in items if here not in Path(str(item.path)).parents]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
