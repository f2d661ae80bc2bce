"""A solo-pool worker drains a deep backlog from every broker without stalling.

A plain Celery worker on the solo pool was seen to stall with 4 unacked and
14,000 ready messages: frames already read into a client buffer wait for a
socket wake-up that never comes.  The transport reads each broker until its
socket is empty, so the backlog drains.
"""

from __future__ import annotations

from kombu import Connection

from tests.integration.celery_app import app as celery_app
from tests.integration.conftest import FAST


def test_a_solo_worker_drains_a_backlog_spread_over_three_brokers(brokers, worker):
    count = 3000
    with Connection(brokers.beetle_url, transport_options=FAST) as conn, conn.Producer() as p:
        task = celery_app.tasks["it.record"]
        for i in range(count):
            task.apply_async((i,), producer=p)
    w = worker(brokers.beetle_url, pool="solo")
    assert w.wait_for(set(range(count)), timeout=120) == set()
    assert sum(w.run_counts().values()) == count  # plain tasks: one copy, run once
