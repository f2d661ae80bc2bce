"""LISTEN/NOTIFY wake-ups: a relay that polls only every 30 s relays a committed row at
once when the enqueue sent a NOTIFY, and falls back to polling without one."""

from __future__ import annotations

import threading

import pytest
from kombu import Connection
from sqlalchemy.orm import Session

from celery_beetle import outbox
from celery_beetle.outbox.db import engine_for
from celery_beetle.outbox.relay import Relay
from celery_beetle.testing.waiting import wait_until
from tests.chaos.run import FAST
from tests.exactly_once.app import make_app


@pytest.fixture
def sleepy_relay(brokers, redis_url, outbox_db):
    """A listening relay whose polls are 30 s apart, running on a thread."""
    engine = engine_for(outbox_db)
    stop = threading.Event()
    with Connection(brokers.beetle_url, transport_options=dict(FAST)) as conn:
        conn.ensure_connection(max_retries=3)
        relay = Relay(engine, conn.channel(), min_interval_s=30, max_interval_s=30, listen=True)
        thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
        thread.start()
        assert wait_until(lambda: relay.listener._conn is not None, timeout=10)
        yield relay
        stop.set()
        thread.join(35)
    engine.dispose()


def _enqueue(app, relay, n: int) -> None:
    with Session(relay.engine) as session, session.begin():
        for i in range(n):
            outbox.delay(session, app.tasks["eo.record"], i)


def test_a_commit_with_notify_wakes_a_listening_relay(brokers, redis_url, sleepy_relay):
    app = make_app(brokers.beetle_url, redis_url, conf={"beetle_outbox_notify": True})
    for done in (3, 6, 9):
        _enqueue(app, sleepy_relay, 3)
        assert wait_until(lambda n=done: sleepy_relay.counts["relayed"] == n, timeout=10)


def test_without_notify_the_relay_waits_for_its_poll(brokers, redis_url, sleepy_relay):
    app = make_app(brokers.beetle_url, redis_url)
    _enqueue(app, sleepy_relay, 3)
    assert not wait_until(lambda: sleepy_relay.counts["relayed"] > 0, timeout=3)
