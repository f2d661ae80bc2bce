"""Dedup scopes on real brokers and Redis: a message is one per ``(scope, message_id)``.

The old and the new queue of a live migration share a scope, so a message published into
both (a blue-green deploy consuming both) runs once; two queues of a fan-out are two scopes,
so one message id in both runs once in each.
"""

from __future__ import annotations

import json
import uuid

import redis

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts


def _drained(brokers, queues: tuple[str, ...]) -> bool:
    for depths in brokers.queue_depths():
        if any(sum(depths.get(queue, (0, 0))) for queue in queues):
            return False
    return True


def _scopes_env(scopes: dict[str, str]) -> dict[str, str]:
    return {"BEETLE_TEST_CONF": json.dumps({"beetle_dedup_scopes": scopes})}


def test_a_message_in_two_queues_of_one_scope_runs_once(brokers, redis_url, client, eo_worker):
    app = client(conf={"beetle_dedup_scopes": {"jobs.v2": "jobs"}})
    record = app.tasks["eo.record"]
    message_ids = [str(uuid.uuid4()) for _ in range(10)]
    for item, message_id in enumerate(message_ids):
        record.apply_async((item,), queue="jobs", task_id=message_id, message_id=message_id)
        record.apply_async((item,), queue="jobs.v2", task_id=message_id, message_id=message_id)
    worker = eo_worker(queue="jobs,jobs.v2", extra_env=_scopes_env({"jobs.v2": "jobs"}))
    items = dict.fromkeys(range(10), 1)
    assert wait_until(lambda: counts([worker]) == items, timeout=30)
    assert wait_until(lambda: _drained(brokers, ("jobs", "jobs.v2")), timeout=20), (
        "all four copies of each message are acked"
    )
    assert counts([worker], "start") == items
    assert counts([worker]) == items
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    assert store.hget(f"beetle:{{jobs:{message_ids[0]}}}", "s") == "c"
    assert not store.exists(f"beetle:{{jobs.v2:{message_ids[0]}}}")
    assert "Traceback" not in worker.log_text()


def test_one_message_id_in_two_scopes_runs_once_in_each(brokers, client, eo_worker):
    app = client()
    record = app.tasks["eo.record"]
    for item in range(5):
        message_id = str(uuid.uuid4())
        record.apply_async((item,), queue="billing", task_id=message_id, message_id=message_id)
        record.apply_async(
            (100 + item,), queue="shipping", task_id=message_id, message_id=message_id
        )
    worker = eo_worker(queue="billing,shipping")
    items = {**dict.fromkeys(range(5), 1), **dict.fromkeys(range(100, 105), 1)}
    assert wait_until(lambda: counts([worker]) == items, timeout=30)
    assert wait_until(lambda: _drained(brokers, ("billing", "shipping")), timeout=20)
    assert counts([worker], "start") == items
    assert counts([worker]) == items


def test_a_queue_whose_name_holds_a_colon_runs_each_message_once(brokers, client, eo_worker):
    app = client()
    record = app.tasks["eo.record"]
    for item in range(5):
        record.apply_async((item,), queue="shop:orders", task_id=f"order:{item}")
    worker = eo_worker(queue="shop:orders")
    items = dict.fromkeys(range(5), 1)
    assert wait_until(lambda: counts([worker]) == items, timeout=30)
    assert wait_until(lambda: _drained(brokers, ("shop:orders",)), timeout=20)
    assert counts([worker], "start") == items
