"""A worker of :mod:`tests.celery_semantics.semantics_app` and a publisher of it, on two
real brokers (BeetleTasks) or on one through ``pyamqp://`` (plain Celery, the comparison),
with a Redis result backend."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from celery_beetle.testing.worker import WorkerProcess
from tests.celery_semantics.semantics_app import make_app

#: the repository: the workers run its test apps
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Semantics:
    app: Any
    out: Path
    log: Path

    def runs(self) -> Counter[str]:
        """Body runs by task (``add``, ``tsum``, …), from the runs file."""
        lines = self.out.read_text().splitlines()
        return Counter(line.split()[0] for line in lines if line.strip())

    def worker_log(self) -> str:
        return self.log.read_text()


def _backend(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0] + "/1"


def start(brokers: Any, redis_url: str, tmp_path: Path, plain: bool) -> Iterator[Semantics]:
    out, log = tmp_path / "runs.out", tmp_path / "worker.log"
    out.touch()
    url = brokers.nodes[0].amqp_url(brokers.vhost) if plain else brokers.url_for(0, 1)
    backend = _backend(redis_url)
    env = {"BEETLE_TEST_URL": url, "BEETLE_TEST_REDIS": redis_url,
           "BEETLE_TEST_BACKEND": backend, "BEETLE_TEST_OUT": str(out),
           "BEETLE_TEST_PLAIN": "1" if plain else "0"}  # fmt: skip
    worker = WorkerProcess(
        "tests.celery_semantics.semantics_app", log, env, pool="prefork", concurrency=2,
        name="semantics", root=ROOT,
    ).start()  # fmt: skip
    publisher = make_app(url, redis_url, backend, plain=plain)
    try:
        yield Semantics(publisher, out, log)
    finally:
        worker.kill()
        publisher.close()


@pytest.fixture
def beetle_semantics(brokers: Any, redis_url: str, tmp_path: Path) -> Iterator[Semantics]:
    """Every task a BeetleTask (``task_cls``), on two brokers."""
    yield from start(brokers, redis_url, tmp_path, plain=False)


@pytest.fixture(params=["beetle", "plain"])
def semantics(request: Any, brokers: Any, redis_url: str, tmp_path: Path) -> Iterator[Semantics]:
    """The same app as BeetleTasks on two brokers, then as plain Celery on one."""
    yield from start(brokers, redis_url, tmp_path, plain=request.param == "plain")
