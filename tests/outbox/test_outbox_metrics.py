"""The outbox's backlog as Prometheus gauges, read from PostgreSQL when scraped."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import sqlalchemy as sa

from celery_beetle.outbox.db import engine_for
from celery_beetle.outbox.metrics import OutboxCollector
from celery_beetle.outbox.table import ASIDE, OUTBOX

pytest.importorskip("prometheus_client")

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)


def _row(created: dt.datetime, **more: object) -> dict[str, object]:
    return {
        "id": str(uuid.uuid4()),
        "task_name": "shop.charge",
        "routing_key": "celery",
        "body": b"[]",
        "headers": {},
        "properties": {},
        "scheduled_at": created,
        "created_at": created,
        "expires_at": created + dt.timedelta(days=1),
        **more,
    }


def _gauges(engine: sa.Engine) -> dict[str, float]:
    collector = OutboxCollector(engine, clock=NOW.timestamp)
    return {s.name: s.value for family in collector.collect() for s in family.samples}


def test_pending_rows_their_oldest_age_and_rows_set_aside_are_gauges(outbox_db):
    engine = engine_for(outbox_db)
    try:
        assert _gauges(engine) == {
            "beetle_outbox_pending_rows": 0,
            "beetle_outbox_oldest_pending_age_seconds": 0.0,
            "beetle_outbox_aside_rows": 0,
        }
        with engine.begin() as conn:
            conn.execute(
                sa.insert(OUTBOX),
                [_row(NOW - dt.timedelta(seconds=90)), _row(NOW - dt.timedelta(seconds=5))],
            )
            conn.execute(sa.insert(ASIDE), [_row(NOW, reason="expired", moved_at=NOW)])
        assert _gauges(engine) == {
            "beetle_outbox_pending_rows": 2,
            "beetle_outbox_oldest_pending_age_seconds": 90.0,
            "beetle_outbox_aside_rows": 1,
        }
    finally:
        engine.dispose()


def test_a_database_that_does_not_answer_gives_no_gauges_rather_than_a_failed_scrape():
    engine = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert _gauges(engine) == {}
