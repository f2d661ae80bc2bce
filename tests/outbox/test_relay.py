"""The relay's handling of rows it must not publish, and ``beetle outbox`` list/retry.

Real PostgreSQL and brokers, the relay in this process (one pass at a time).
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from kombu import Connection
from sqlalchemy.orm import Session

from celery_beetle import outbox
from celery_beetle.cli import main
from celery_beetle.outbox.db import engine_for
from celery_beetle.outbox.relay import Relay
from celery_beetle.outbox.table import ASIDE, OUTBOX
from tests.chaos.run import FAST
from tests.exactly_once.app import make_app


@pytest.fixture
def app(brokers, redis_url):
    return make_app(brokers.beetle_url, redis_url, transport_options=dict(FAST))


@pytest.fixture
def relay(app, outbox_db):
    engine = engine_for(outbox_db)
    with Connection(app.conf.broker_url, transport_options=dict(FAST)) as conn:
        conn.ensure_connection(max_retries=3)
        yield Relay(engine, conn.channel(), batch_size=100)
    engine.dispose()


def _enqueue(app, engine, count: int, **options) -> list[str]:
    task = app.tasks["eo.record"]
    with Session(engine) as session, session.begin():
        return [outbox.apply_async(session, task, (i,), **options).id for i in range(count)]


def _spoil(engine, message_id: str, **values) -> None:
    with engine.begin() as conn:
        conn.execute(sa.update(OUTBOX).where(OUTBOX.c.id == message_id).values(**values))


def test_bad_rows_are_set_aside_with_a_reason_and_the_rest_relayed(app, relay, brokers):
    engine = relay.engine
    ids = _enqueue(app, engine, 6)
    _spoil(engine, ids[1], exchange="no-such-exchange", declare=None)
    _spoil(engine, ids[2], properties={"priority": "high", "message_id": ids[2]})
    _spoil(engine, ids[3], expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
    result = relay.relay_once()
    assert sorted(result.relayed) == sorted([ids[0], ids[4], ids[5]])
    assert set(result.aside) == {ids[1], ids[2], ids[3]}
    assert "no-such-exchange" in result.aside[ids[1]]
    assert "bad payload" in result.aside[ids[2]]
    assert "dedup window" in result.aside[ids[3]]
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(OUTBOX)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(ASIDE)).scalar_one() == 3
    depths = [node.get("celery", (0, 0))[0] for node in brokers.queue_depths()]
    assert sum(depths) == 6  # three messages, two copies each


def test_a_row_not_yet_due_is_left_for_later(app, relay):
    _enqueue(app, relay.engine, 2, countdown=60)
    assert relay.relay_once().claimed == 0
    relay.clock = lambda: dt.datetime.now(dt.timezone.utc).timestamp() + 61
    assert len(relay.relay_once().relayed) == 2


def test_outbox_list_shows_rows_set_aside_and_retry_puts_them_back(app, relay, outbox_db):
    engine = relay.engine
    ids = _enqueue(app, engine, 2)
    _spoil(engine, ids[0], expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
    relay.relay_once()
    runner = CliRunner()
    listed = runner.invoke(main, ["outbox", "list", "--db", outbox_db])
    assert listed.exit_code == 0, listed.output
    assert "0 row(s) waiting" in listed.output and ids[0] in listed.output
    retried = runner.invoke(main, ["outbox", "retry", "--db", outbox_db, ids[0]])
    assert retried.exit_code == 0, retried.output
    assert relay.relay_once().relayed == [ids[0]]  # with a fresh expiry


def test_outbox_retry_without_ids_is_a_usage_error(outbox_db):
    result = CliRunner().invoke(main, ["outbox", "retry", "--db", outbox_db])
    assert result.exit_code == 2 and "--all" in result.output


def test_an_eager_app_refuses_to_enqueue(app, outbox_db):
    app.conf.task_always_eager = True
    with Session(engine_for(outbox_db)) as session, pytest.raises(outbox.OutboxError):
        outbox.delay(session, app.tasks["eo.record"], 1)
