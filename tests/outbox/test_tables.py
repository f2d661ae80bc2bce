"""The shipped Alembic migration makes the tables the relay expects; ``beetle outbox init``."""

from __future__ import annotations

import time
import uuid

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from click.testing import CliRunner

from celery_beetle.cli import main
from celery_beetle.outbox.db import engine_for
from celery_beetle.outbox.ids import id_time_ms, new_id
from celery_beetle.outbox.migrate import upgrade
from celery_beetle.outbox.table import metadata


def test_the_alembic_migration_matches_the_tables(postgres):
    engine = engine_for(postgres.create_database(f"m_{uuid.uuid4().hex[:12]}"))
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert [d for d in diff if "beetle_outbox_alembic" not in str(d)] == []


def test_outbox_init_creates_the_tables_and_is_harmless_twice(postgres):
    url = postgres.create_database(f"i_{uuid.uuid4().hex[:12]}")
    for _ in range(2):
        result = CliRunner().invoke(main, ["outbox", "init", "--db", url])
        assert result.exit_code == 0, result.output


def test_a_bad_database_url_is_a_usage_error_with_the_expected_form():
    result = CliRunner().invoke(main, ["outbox", "list", "--db", "not a url"])
    assert result.exit_code == 2 and "postgresql://" in result.output


def test_ids_are_time_ordered_within_a_millisecond_and_carry_their_time():
    before = time.time_ns() // 1_000_000
    ids = [new_id() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert before <= id_time_ms(ids[0]) <= id_time_ms(ids[-1]) <= time.time_ns() // 1_000_000 + 5
    assert id_time_ms(str(uuid.uuid4())) is None
