"""Per-key ordering: rows of one ordering key are published one after another in id order,
a row set aside stops its key (and only its key) until an operator retries or drops it.

Real PostgreSQL and brokers; the relay in this process, one pass at a time, with its
``publish_many`` calls recorded: one call is one set of publishes in flight together.
"""

from __future__ import annotations

import datetime as dt
import threading

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
from celery_beetle.testing.waiting import wait_until
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


def enqueue(app, engine, keys: list[str | None], serialize=False, **options) -> list[str]:
    task = app.tasks["eo.record"]
    with Session(engine) as session, session.begin():
        if serialize:  # the README's advice: a key's writers one at a time, so that ids follow
            for key in sorted({k for k in keys if k}):  # commits (sorted: no deadlock)
                lock = sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))")
                session.execute(lock, {"key": key})
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


def test_two_relays_under_load_keep_every_keys_order_on_every_broker(app, engine, brokers):
    """Three writers enqueue rows of ten keys (and unordered ones) while two relays run side
    by side; then each broker's queue, read in order, holds each key's rows in id order.
    The writers of a key are serialized, as the README says they must be for commit order
    to be id order (unserialized, the later id of two concurrent transactions may commit
    first, and it is published first)."""
    key_of: dict[str, str | None] = {}

    def write(writer: int) -> None:
        for j in range(40):
            keys = [f"k{(writer + j) % 10}", None, f"k{j % 10}"]
            key_of.update(zip(enqueue(app, engine, keys, serialize=True), keys, strict=True))

    writers = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    stop = threading.Event()
    relays = [threading.Thread(target=_relay_until, args=(app, engine, stop)) for _ in range(2)]
    for thread in writers + relays:
        thread.start()
    for thread in writers:
        thread.join(60)
    assert wait_until(lambda: _waiting(engine) == 0, timeout=60)
    stop.set()
    for thread in relays:
        thread.join(30)
    seen = 0
    for node in brokers.nodes:
        connection = node.connect(brokers.vhost)
        channel = connection.channel()
        last: dict[str, str] = {}
        while True:
            method, properties, _ = channel.basic_get("celery", auto_ack=True)
            if method is None:
                break
            seen += 1
            key = key_of[properties.message_id]
            if key is not None:
                assert properties.message_id > last.get(key, ""), f"{key} out of order"
                last[key] = properties.message_id
        connection.close()
    assert seen == 2 * len(key_of) == 2 * 3 * 40 * 3  # every row, two copies


def _relay_until(app, engine, stop: threading.Event) -> None:
    with Connection(app.conf.broker_url, transport_options=dict(FAST)) as conn:
        conn.ensure_connection(max_retries=3)
        Relay(engine, conn.channel(), batch_size=20, per_key=3).run(stop)


def _waiting(engine) -> int:
    with engine.connect() as c:
        return int(c.execute(sa.select(sa.func.count()).select_from(OUTBOX)).scalar_one())
