"""BeetleTask workers on quorum queues (real nodes): per-consumer prefetch, each message run
once, retries through delay queues and dead letters as on classic queues."""

from __future__ import annotations

import json

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts

QUORUM = {"task_default_queue_type": "quorum"}


def _dead_copies(brokers) -> int:  # type: ignore[no-untyped-def]
    return sum(depths.get("celery.dead", (0, 0))[0] for depths in brokers.queue_depths())


def test_beetle_workers_consume_a_quorum_queue_with_per_consumer_prefetch_and_run_once(
    brokers, client, eo_worker
):
    options = {"attempts": 3, "exceptions": 2, "retry_delay": 0.3, "max_delay": 1}
    env = {"BEETLE_TEST_CONF": json.dumps(QUORUM)}
    workers = [
        eo_worker(pool="prefork", concurrency=2, task_options=options, extra_env=env)
        for _ in range(2)
    ]
    app = client(conf=QUORUM, task_options=options)
    items = list(range(40))
    for i in items:
        app.tasks["eo.record"].delay(i)
    for i in (100, 101):
        app.tasks["eo.flaky"].delay(i)
    assert wait_until(lambda: all(counts(workers)[i] == 1 for i in items), timeout=30)
    # each flaky message: retried through delay queues, then a dead letter on two brokers
    assert wait_until(lambda: _dead_copies(brokers) == 4, timeout=30)
    assert all(2 <= counts(workers, "start")[i] <= options["attempts"] for i in (100, 101))
    assert all(counts(workers)[i] == 1 for i in items), "no message ran twice"
    for node in brokers.nodes:
        queue = node._api("GET", f"/api/queues/{brokers.vhost}/celery")
        assert queue["type"] == "quorum"

        def on_celery(node=node) -> list[dict]:
            consumers = node._api("GET", f"/api/consumers/{brokers.vhost}")
            return [c for c in consumers if c["queue"]["name"] == "celery"]

        # the management API lists consumers after its next stats round (up to 5 s)
        assert wait_until(lambda: len(on_celery()) == 2, timeout=30)
        # per consumer: Celery's prefetch (concurrency 2 x multiplier 4) on each consumer
        assert {c["prefetch_count"] for c in on_celery()} == {8}
