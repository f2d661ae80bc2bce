"""Celery's prefetch window widens for what a worker holds (real nodes, default prefetch).

A worker holds each countdown/ETA task it received until it is due, and Celery widens its
prefetch by one for each (``qos.increment_eventually``), so held tasks never take the slots
of tasks that are due now. pyamqp workers on RabbitMQ 3.x get that from a channel-wide
prefetch; beetle workers must too, on classic and on quorum queues
(:mod:`kombu_beetle.prefetch`)."""

from __future__ import annotations

import json
import time

import pytest

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts

#: BeetleTask's defaults (tests.exactly_once.app sets shorter ones for other tests)
DEFAULTS = {"timeout": 300, "attempts": 1, "exceptions": 0, "retry_delay": 10, "max_delay": 600}
QUORUM = {"task_default_queue_type": "quorum"}
COUNTDOWN_S = 60
#: Celery's default prefetch for the worker below: concurrency 2 x multiplier 4, per broker
PREFETCH = 8


def _unacked(brokers, queue: str = "celery") -> list[int]:  # type: ignore[no-untyped-def]
    return [depths.get(queue, (0, 0))[1] for depths in brokers.queue_depths()]


@pytest.mark.parametrize("conf", [{}, QUORUM], ids=["classic", "quorum"])
def test_held_countdown_tasks_leave_the_prefetch_window_to_tasks_due_now(
    brokers, client, eo_worker, conf
):
    env = {"BEETLE_TEST_CONF": json.dumps(conf)}
    worker = eo_worker(pool="prefork", concurrency=2, task_options=DEFAULTS, extra_env=env)
    app = client(conf=conf, task_options=DEFAULTS)
    record = app.tasks["eo.record"]
    # two copies per task: enough countdown copies to fill every broker's window
    held = list(range(1000, 1000 + PREFETCH * len(brokers.nodes)))
    for i in held:
        record.apply_async((i,), countdown=COUNTDOWN_S)
    published = time.monotonic()
    assert wait_until(lambda: min(_unacked(brokers)) >= PREFETCH, timeout=30), _unacked(brokers)

    due_now = list(range(100))
    for i in due_now:
        record.delay(i)
    left = COUNTDOWN_S - 15 - (time.monotonic() - published)
    assert wait_until(lambda: all(counts([worker])[i] == 1 for i in due_now), timeout=left), (
        f"{sum(counts([worker])[i] for i in due_now)} of 100 tasks due now ran "
        f"while {len(held)} countdown tasks were held"
    )
    assert not any(counts([worker])[i] for i in held), "no countdown task ran early"


def test_copies_the_gate_defers_widen_the_prefetch_window(brokers, client, eo_worker):
    # two workers: a copy whose twin runs on the other worker is deferred while that run
    # holds its lease, and the gate widens the window by one for each
    workers = [eo_worker(pool="prefork", concurrency=2, task_options=DEFAULTS) for _ in range(2)]
    app = client(task_options=DEFAULTS)
    window = PREFETCH * len(workers)  # per broker: one consumer per worker
    for i in range(window * len(brokers.nodes)):
        app.tasks["eo.record"].delay(i, 3.0)
    assert wait_until(lambda: max(_unacked(brokers)) > window, timeout=20), (
        f"unacked per broker {_unacked(brokers)}: the windows stayed at {window}"
    )
