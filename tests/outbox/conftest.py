"""Fixtures for the outbox: a throwaway PostgreSQL (:mod:`celery_beetle.testing.postgres`) and a
database with the outbox tables per test.

``postgres`` (session) is shared; tests that kill it take ``postgres_own``. A missing
PostgreSQL skips locally and fails under ``CI=true``, as a missing RabbitMQ does.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_beetle.testing.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.integration


def _need_postgres() -> None:
    if postgres_bin_dir() is None:
        message = "PostgreSQL is not installed (initdb not found; set BEETLE_PG_BIN)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    _need_postgres()
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.remove()


@pytest.fixture
def postgres_own() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, to kill -9 and restart."""
    _need_postgres()
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.remove()


def new_outbox_db(server: PostgresServer) -> str:
    """A fresh database with the outbox tables and an ``orders`` table; its URL."""
    from celery_beetle.outbox.db import engine_for
    from celery_beetle.outbox.table import create_tables
    from tests.outbox.run import create_orders

    url = server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    engine = engine_for(url)
    create_tables(engine)
    create_orders(engine)
    engine.dispose()
    return url


@pytest.fixture
def outbox_db(postgres: PostgresServer) -> str:
    if not postgres.is_running:
        postgres.start()
    return new_outbox_db(postgres)


@pytest.fixture
def outbox_run(brokers: Any, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``outbox_run(name, db_url)`` -> an OutboxRun; its workers and relays are killed after."""
    from tests.outbox.run import OutboxRun

    runs: list[OutboxRun] = []

    def make(name: str, db_url: str, **options: Any) -> OutboxRun:
        run = OutboxRun(name, brokers, redis_url, tmp_path / name, db_url, **options)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.kill_all()
