"""Per-key ordering: rows of one ordering key are published one after another in id order,
a row set aside stops its key (and only its key) until an operator retries or drops it.

Real PostgreSQL and brokers; the relay in this process, one pass at a time, with its
``publish_many`` calls recorded: one call is one set of publishes in flight together.
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
from celery_beetle.outbox.relay import Relay, claim_keyed
from celery_beetle.outbox.table import OUTBOX
from tests.chaos.run import FAST
from tests.exactly_once.app import make_app


@pytest.fixture
def app(brokers, redis_url):
    return make_app(brokers.beetle_url, redis_url, transport_options=dict(FAST))


@pytest.fixture
def conn(app):
    with Connection(app.conf.broker_url, transport_options=dict(FAST)) as conn:
        conn.ensure_connection(max_retries=3)
        yield conn


@pytest.fixture
def engine(outbox_db):
    engine = engine_for(outbox_db)
    yield engine
    engine.dispose()


def recording_relay(engine, conn) -> tuple[Relay, list[list[str]]]:
    """A relay whose publish_many calls are recorded as lists of message ids."""
    relay = Relay(engine, conn.channel(), batch_size=100)
    calls: list[list[str]] = []
    publisher = relay.channel.publisher
    original = publisher.publish_many

    def publish_many(outgoing, *args, **kwargs):
        calls.append([o.message.properties["message_id"] for o in outgoing])
        return original(outgoing, *args, **kwargs)

    publisher.publish_many = publish_many
    return relay, calls


def enqueue(app, engine, keys: list[str | None], **options) -> list[str]:
    task = app.tasks["eo.record"]
    with Session(engine) as session, session.begin():
        return [
            outbox.apply_async(session, task, (i,), ordering_key=key, **options).id
            for i, key in enumerate(keys)
        ]


def test_rows_of_a_key_go_one_after_another_in_id_order_and_other_rows_do_not_wait(
    app, engine, conn
):
    ids = enqueue(app, engine, ["a", "b", None, "a", None, "b", "a"])
    a, b = [ids[0], ids[3], ids[6]], [ids[1], ids[5]]
    relay, calls = recording_relay(engine, conn)
    result = relay.relay_once()
    assert sorted(result.relayed) == sorted(ids)
    # the first publishes carry the unordered rows and each key's head; then a row per key
    assert sorted(calls[0]) == sorted([ids[2], ids[4], a[0], b[0]])
    assert sorted(calls[1]) == sorted([a[1], b[1]])
    assert calls[2] == [a[2]]


def test_a_row_set_aside_stops_its_key_until_dropped_and_other_keys_go_on(
    app, engine, conn, outbox_db
):
    ids = enqueue(app, engine, ["a", "a", "a", "b", "b"])
    with engine.begin() as c:  # the second row of "a" cannot be published
        c.execute(
            sa.update(OUTBOX).where(OUTBOX.c.id == ids[1]).values(exchange="nowhere", declare=None)
        )
    relay, _ = recording_relay(engine, conn)
    result = relay.relay_once()
    assert sorted(result.relayed) == sorted([ids[0], ids[3], ids[4]])
    assert list(result.aside) == [ids[1]]
    assert relay.relay_once().claimed == 0  # ids[2] waits behind the row set aside
    enqueue(app, engine, ["b"])
    assert len(relay.relay_once().relayed) == 1  # "b" goes on
    listed = CliRunner().invoke(main, ["outbox", "list", "--db", outbox_db])
    assert listed.exit_code == 0, listed.output
    assert "ordering key 'a': 1 later row(s) wait for this one" in listed.output
    dropped = CliRunner().invoke(main, ["outbox", "drop", "--db", outbox_db, ids[1]])
    assert dropped.exit_code == 0, dropped.output
    assert relay.relay_once().relayed == [ids[2]]


def test_a_retried_row_goes_before_the_later_rows_of_its_key(app, engine, conn, outbox_db):
    ids = enqueue(app, engine, ["a", "a", "a"])
    with engine.begin() as c:
        c.execute(sa.update(OUTBOX).where(OUTBOX.c.id == ids[0]).values(
            expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)))  # fmt: skip
    relay, calls = recording_relay(engine, conn)
    assert relay.relay_once().relayed == []
    retried = CliRunner().invoke(main, ["outbox", "retry", "--db", outbox_db, ids[0]])
    assert retried.exit_code == 0, retried.output
    calls.clear()
    assert relay.relay_once().relayed == ids
    assert calls == [[ids[0]], [ids[1]], [ids[2]]]


def test_a_key_held_by_one_relay_is_skipped_whole_by_another(app, engine, conn):
    ids = enqueue(app, engine, ["a", "a", "b"])
    now = dt.datetime.now(dt.timezone.utc)
    relay, _ = recording_relay(engine, conn)
    with engine.begin() as other:  # another relay's pass holds the oldest key, "a"
        taken = claim_keyed(other, now, 1, 100)
        assert [[row["id"] for row in seq] for seq in taken] == [ids[:1]]
        assert relay.relay_once().relayed == [ids[2]]  # "b" goes on, "a" is not touched
    assert relay.relay_once().relayed == ids[:2]  # the other pass ended without a publish


def test_a_row_not_yet_due_holds_back_the_later_rows_of_its_key(app, engine, conn):
    first = enqueue(app, engine, ["a"], countdown=60)
    later = enqueue(app, engine, ["a", "b"])
    relay, _ = recording_relay(engine, conn)
    assert relay.relay_once().relayed == [later[1]]
    relay.clock = lambda: dt.datetime.now(dt.timezone.utc).timestamp() + 61
    assert relay.relay_once().relayed == [first[0], later[0]]


def test_a_bad_ordering_key_is_refused(app, engine):
    with pytest.raises(outbox.OutboxError, match="ordering_key"):
        enqueue(app, engine, [""])
