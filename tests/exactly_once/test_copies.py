"""Redundant copies: every BeetleTask message is delivered twice and runs once."""

from __future__ import annotations

import json

import redis

from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import celery_queue_empty
from tests.harness.waiting import wait_until


def test_second_copy_is_acked_without_running_when_first_completed(
    brokers, redis_url, client, eo_worker
):
    app = client()
    result = app.tasks["eo.record"].delay(1)
    copies = sum(depths.get("celery", (0, 0))[0] for depths in brokers.queue_depths())
    assert copies == 2, "a BeetleTask message is published to two brokers"
    worker = eo_worker(pool="solo")
    assert wait_until(lambda: counts([worker])[1] == 1)
    assert wait_until(lambda: celery_queue_empty(brokers)), "both copies are acked"
    assert counts([worker], "start") == {1: 1}
    key = f"beetle:{{celery:{result.id}}}"
    assert redis.Redis.from_url(redis_url, decode_responses=True).hget(key, "s") == "c"
    assert "Traceback" not in worker.log_text()


def test_concurrent_copies_on_two_workers_run_once(brokers, client, eo_worker):
    app = client()
    first = eo_worker(pool="prefork", concurrency=2)
    second = eo_worker(pool="solo")
    items = list(range(40))
    for item in items:
        app.tasks["eo.record"].delay(item, 0.05)
    assert wait_until(lambda: set(counts([first, second])) == set(items), timeout=40)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=20)
    assert counts([first, second], "start") == dict.fromkeys(items, 1)
    assert counts([first, second]) == dict.fromkeys(items, 1)


def test_plain_task_is_published_once_and_runs_once_without_redis(
    brokers, redis_url, client, eo_worker
):
    app = client()
    app.tasks["eo.plain"].delay(7)
    copies = sum(depths.get("celery", (0, 0))[0] for depths in brokers.queue_depths())
    assert copies == 1
    worker = eo_worker()
    assert wait_until(lambda: counts([worker])[7] == 1)
    assert wait_until(lambda: celery_queue_empty(brokers))
    assert counts([worker], "start") == {7: 1}
    # nothing but the worker's own probe of the store (a key that expires in 10 s)
    keys = redis.Redis.from_url(redis_url).keys()
    assert [key for key in keys if not key.startswith(b"beetle:probe")] == []


def test_gate_and_task_write_trace_events_when_a_trace_dir_is_set(
    brokers, client, eo_worker, tmp_path
):
    trace_dir = tmp_path / "trace"
    app = client()
    worker = eo_worker(trace_dir=str(trace_dir))
    result = app.tasks["eo.record"].delay(5)
    assert wait_until(lambda: counts([worker])[5] == 1)

    def events() -> list[dict]:
        lines = [line for f in trace_dir.glob("*.jsonl") for line in f.read_text().splitlines()]
        return [e for e in map(json.loads, lines) if e["message_id"] == result.id]

    def names() -> list[str]:
        return sorted(e["event"] for e in events())

    expected = ["completed", "delivered", "delivered", "duplicate", "started"]
    assert wait_until(lambda: names() == expected, timeout=10), names()
    started = next(e for e in events() if e["event"] == "started")
    assert started["queue"] == "celery"
    assert started["task_id"] == result.id
    assert started["attempt"] == 1
    brokers_seen = {e["broker"] for e in events() if e["event"] == "delivered"}
    assert len(brokers_seen) == 2, "one delivery per broker copy"
