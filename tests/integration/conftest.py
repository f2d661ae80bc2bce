"""Fixtures for transport integration tests: kombu connections and worker subprocesses."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

import kombu_beetle  # noqa: F401
from tests.integration.workers import Worker

#: short timeouts so that fault tests finish quickly
FAST = {
    "confirm_timeout": 1.0,
    "reconnect_interval": 0.2,
    "reconnect_max_interval": 1.0,
    "connect_timeout": 1.0,
}


@pytest.fixture
def connect(brokers) -> Iterator[Callable[..., Connection]]:
    """``connect(url=None, **transport_options)``: a kombu Connection closed after the test."""
    made: list[Connection] = []

    def make(url: str | None = None, **options: Any) -> Connection:
        conn = Connection(url or brokers.beetle_url, transport_options={**FAST, **options})
        conn.connect()
        made.append(conn)
        return conn

    yield make
    for conn in made:
        conn.release()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """``worker(url, **kwargs)``: a started Celery worker subprocess, stopped after the test."""
    started: list[Worker] = []

    def make(url: str, name: str = "w", **kwargs: Any) -> Worker:
        kwargs.setdefault("options", FAST)
        w = Worker(url, tmp_path / f"{name}{len(started)}.out", **kwargs).start()
        started.append(w)
        return w

    yield make
    for w in started:
        w.kill()
