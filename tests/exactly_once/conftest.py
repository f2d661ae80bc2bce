"""Fixtures for exactly-once tests: worker subprocesses of ``tests.exactly_once.app``.

``eo_worker(**kwargs)`` starts a Celery worker on the test's brokers and Redis; every run of
a task appends ``<event> <item> <pid> <time>`` to the worker's output file, so tests count
starts and completions per message across workers without trusting the code under test.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import celery_beetle  # noqa: F401  (registers beetle://)
from celery_beetle.testing.worker import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]

#: short transport timeouts so that fault tests finish quickly
FAST = {
    "confirm_timeout": 1.0,
    "reconnect_interval": 0.2,
    "reconnect_max_interval": 1.0,
    "connect_timeout": 1.0,
}

pytestmark = pytest.mark.integration


class EoWorker(WorkerProcess):
    """A worker process of ``tests.exactly_once.app``."""

    def __init__(
        self,
        url: str,
        redis_url: str,
        out: Path,
        *,
        task_options: dict[str, Any] | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        queue: str = "celery",
        backend: str | None = None,
        trace_dir: str | None = None,
        extra_env: dict[str, str] | None = None,
        root: Path = ROOT,
    ) -> None:
        self.out = out
        env = {
            "BEETLE_TEST_URL": url,
            "BEETLE_TEST_REDIS": redis_url,
            "BEETLE_TEST_OUT": str(out),
            "BEETLE_TEST_OPTIONS": json.dumps(FAST),
            "BEETLE_TEST_QUEUE": queue,
            "BEETLE_TEST_TASK": json.dumps(task_options or {}),
            "BEETLE_TEST_BACKEND": backend or "",
            "BEETLE_TEST_TRACE": trace_dir or "",
            **(extra_env or {}),
        }
        super().__init__(
            "tests.exactly_once.app",
            out.with_suffix(".log"),
            env,
            pool=pool,
            concurrency=concurrency,
            queue=queue,
            name="eo",
            extra_args=("--without-heartbeat",),
            root=root,
        )

    def start(self, ready_timeout: float = 30) -> EoWorker:
        self.out.touch()
        super().start(ready_timeout)
        return self

    def events(self) -> list[tuple[str, int, int, float]]:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        return [(e, int(i), int(p), float(t)) for e, i, p, t in (line.split() for line in lines)]


#: ``extra_env`` of a worker whose gate claims every delivery first, a pool process free or
#: not (``beetle_claim_in_idle_pool`` off): for tests of the gate's own claim
GATE_CLAIMS = {"BEETLE_TEST_CONF": json.dumps({"beetle_claim_in_idle_pool": False})}


def counts(workers: list[EoWorker], event: str = "done") -> Counter[int]:
    """How often each item had ``event``, over all workers."""
    return Counter(i for w in workers for e, i, _, _ in w.events() if e == event)


@pytest.fixture
def eo_worker(brokers: Any, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., EoWorker]]:
    """``eo_worker(url=None, redis=None, **kwargs)``: a started worker, killed after the test."""
    started: list[EoWorker] = []

    def make(url: str | None = None, redis: str | None = None, **kwargs: Any) -> EoWorker:
        out = tmp_path / f"w{len(started)}.out"
        worker = EoWorker(url or brokers.beetle_url, redis or redis_url, out, **kwargs)
        started.append(worker)
        return worker.start()

    yield make
    for worker in started:
        worker.kill()


@pytest.fixture
def client(brokers: Any, redis_url: str) -> Iterator[Callable[..., Celery]]:
    """``client(url=None, **make_app_kwargs)``: a publishing app on this test's brokers."""
    from tests.exactly_once.app import make_app

    made: list[Celery] = []

    def make(url: str | None = None, **kwargs: Any) -> Celery:
        kwargs.setdefault("transport_options", FAST)
        app = make_app(url or brokers.beetle_url, redis_url, **kwargs)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()
