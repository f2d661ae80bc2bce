"""A plain task acked early (``acks_late`` off, Celery's default) under the solo pool is
acked when pyamqp acks it: after its body, not before.

The explorer found a plain task run twice (seed 872208, ``plain_twice``): a solo-pool worker
was SIGKILLed during the body and the broker delivered the message again. Celery hands the
early ack to its event loop (``call_soon_ack``), and the solo pool runs the body on that
loop, so the ack goes out once the body has returned, with ``pyamqp://`` as with
``beetle://``. Plain tasks promise what pyamqp does (docs/guides/limits.md).
"""

from __future__ import annotations

import time

from kombu import Connection

from tests.integration.celery_app import app as celery_app
from tests.integration.conftest import FAST


def _unacked_while_the_body_runs(brokers, worker, url: str) -> tuple[int, int]:
    w = worker(url, pool="solo")
    with Connection(url, transport_options=FAST) as conn, conn.Producer() as p:
        celery_app.tasks["it.record_early"].apply_async((1, 8.0), producer=p)
    deadline = time.monotonic() + 15
    while "-1 started" not in w.out.read_text():
        assert time.monotonic() < deadline, "the body never began"
        time.sleep(0.05)
    depths = brokers.queue_depths(0)[0].get("celery", (0, 0))
    assert w.run_counts()[1] == 0  # the body is still sleeping
    w.stop()
    return depths


def test_a_solo_plain_tasks_early_ack_waits_for_its_body_as_on_pyamqp(brokers, worker):
    on_pyamqp = _unacked_while_the_body_runs(
        brokers, worker, brokers.nodes[0].amqp_url(brokers.vhost)
    )
    brokers.nodes[0].ctl("purge_queue", "-p", brokers.vhost, "celery")
    on_beetle = _unacked_while_the_body_runs(brokers, worker, brokers.url_for(0))
    assert on_pyamqp == on_beetle == (0, 1)  # (ready, unacked): held until the body returns
