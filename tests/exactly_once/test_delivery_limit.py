"""RabbitMQ 4's quorum queue defaults, emulated on real nodes: nothing is lost to them.

RabbitMQ 4.0 gives every quorum queue a ``delivery-limit`` of 20: a message returned more
often (requeued, or given back when a channel closes) is dropped unless the queue
dead-letters. An operator policy sets that limit here on every node, and the queue is
quorum as the operations guide declares it. A worker replaces a delivery counted 10 times
by a fresh copy, so hand-backs, restarts and consumer timeouts never add up to the limit.
Every test runs BeetleTasks at the task options' defaults.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import celery_queue_empty, stored_dead_letters
from tests.exactly_once.test_defaults import DEFAULTS

#: the queue declared quorum as every supported Celery can (``task_default_queue_type`` is
#: Celery 5.5's): a ``task_queues`` entry with its arguments
QUORUM = {
    "task_queues": {
        "celery": {
            "exchange": "celery",
            "routing_key": "celery",
            "queue_arguments": {"x-queue-type": "quorum"},
        }
    }
}
QUORUM_ENV = {"BEETLE_TEST_CONF": json.dumps(QUORUM)}
RABBITMQ_4_LIMIT = 20


@pytest.fixture
def limited(brokers):
    """``brokers`` whose quorum queues drop a message past 20 deliveries (RabbitMQ 4)."""
    definition = json.dumps({"delivery-limit": RABBITMQ_4_LIMIT})
    for node in brokers.nodes:
        node.ctl(
            "set_operator_policy", "-p", brokers.vhost, "rabbitmq-4-limit", ".*", definition,
            "--apply-to", "queues",
        )  # fmt: skip
    return brokers


@pytest.fixture
def consumer_timeout(brokers) -> Iterator[int]:
    """Every node closes a channel holding a delivery unacked for over 5 s (RabbitMQ
    checks once a minute); the default (30 min) is put back after."""
    timeout_ms = 5000
    for node in brokers.nodes:
        node.ctl("eval", f"application:set_env(rabbit, consumer_timeout, {timeout_ms}).")
    yield timeout_ms
    for node in brokers.nodes:
        node.ctl("eval", "application:set_env(rabbit, consumer_timeout, 1800000).")


def _requeue_all(brokers, queue: str, times: int = 1) -> list[int]:
    """Take and requeue every message of ``queue`` on every node ``times`` times, as
    hand-backs and restarts would (each requeue is one delivery of a quorum queue's
    count); returns the ``x-delivery-count`` each message carried in the last round."""
    found: list[int] = []
    for node in brokers.nodes:
        with node.connect(brokers.vhost) as connection:
            channel = connection.channel()
            depth = channel.queue_declare(queue, passive=True).method.message_count
            for round_ in range(times):
                tags = []
                while len(tags) < depth:
                    method, properties, _ = channel.basic_get(queue)
                    if method is None:
                        connection.sleep(0.02)
                        continue
                    tags.append(method.delivery_tag)
                    if round_ == times - 1:
                        found.append((properties.headers or {}).get("x-delivery-count", 0))
                for tag in tags:
                    channel.basic_reject(tag, requeue=True)
    return found


def _spend_deliveries(brokers, queue: str, times: int) -> None:
    _requeue_all(brokers, queue, times)


def _counts_of(brokers, queue: str) -> list[int]:
    """The ``x-delivery-count`` of every message of ``queue`` on every node, put back (a
    requeue, so it counts one delivery more)."""
    return _requeue_all(brokers, queue)


def test_a_delivery_at_the_limit_is_renewed_so_a_restart_after_it_loses_nothing(
    limited, redis_aof, client, eo_worker
):
    brokers = limited
    app = client(conf=QUORUM, task_options=DEFAULTS)
    items = list(range(20))
    for item in items:
        app.tasks["eo.record"].delay(item)
    # both copies of every message counted at the limit (the look at their counts is the
    # twentieth requeue): one more return drops them
    _spend_deliveries(brokers, "celery", RABBITMQ_4_LIMIT - 1)
    assert set(_counts_of(brokers, "celery")) == {RABBITMQ_4_LIMIT - 1}
    redis_aof.kill()  # the worker parks what it takes: nothing runs, nothing is acked
    first = eo_worker(redis=redis_aof.url, task_options=DEFAULTS, extra_env=QUORUM_ENV)
    assert wait_until(lambda: "renewed a delivery" in first.log_text(), timeout=30)
    assert wait_until(lambda: first.log_text().count("renewed a delivery") == 40, timeout=60)
    first.kill()  # every delivery it held goes back: a return each

    # waited for by the brokers' own counts: each look at the copies is one more delivery
    def ready() -> int:
        return sum(depths.get("celery", (0, 0))[0] for depths in brokers.queue_depths())

    assert wait_until(lambda: ready() == 40, timeout=30), "no copy was dropped at the limit"
    counted = _counts_of(brokers, "celery")
    assert len(counted) == 40
    assert max(counted) <= 2, "the renewed copies' counts start again"
    redis_aof.start()
    second = eo_worker(redis=redis_aof.url, task_options=DEFAULTS, extra_env=QUORUM_ENV)
    assert wait_until(lambda: set(counts([second])) == set(items), timeout=60)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=30)
    assert counts([first, second], "start") == dict.fromkeys(items, 1), "each ran once"
    assert stored_dead_letters(brokers) == 0


@pytest.mark.timeout(900)  # five 20 s outages, a flapping Redis, then the drain
def test_repeated_redis_outages_and_restarts_on_limited_quorum_queues_lose_nothing(
    limited, redis_aof, client, eo_worker
):
    brokers = limited
    app = client(conf=QUORUM, task_options=DEFAULTS)
    options = {"task_options": DEFAULTS, "extra_env": QUORUM_ENV, "redis": redis_aof.url}
    options["pool"], options["concurrency"] = "prefork", 2
    worker = eo_worker(**options)
    workers = [worker]
    items = list(range(500))
    for item in items:
        app.tasks["eo.record"].delay(item, 0.1)
    # five outages of 20 s within the messages' life; a deploy during the third: the
    # worker's warm shutdown stores what it owes once Redis is back, then a new worker
    for outage in range(5):
        assert wait_until(lambda n=outage: len(counts(workers)) >= 40 * (n + 1), timeout=60)
        redis_aof.kill()
        if outage != 2:
            time.sleep(20)
            redis_aof.start()
            continue
        time.sleep(5)
        stopping = threading.Thread(target=worker.stop, kwargs={"timeout": 90})
        stopping.start()
        time.sleep(15)
        redis_aof.start()
        stopping.join()
        assert "stored 0 of" not in worker.log_text()
        worker = eo_worker(**options)
        workers.append(worker)
    # then a flapping Redis: up and down every second, ten times
    for _ in range(10):
        redis_aof.kill()
        time.sleep(1)
        redis_aof.start()
        time.sleep(1)
    assert wait_until(lambda: set(counts(workers)) == set(items), timeout=240), (
        f"not run: {sorted(set(items) - set(counts(workers)))[:20]}"
    )
    # a copy deferred behind its twin's lease is looked at again by the lease's end (300 s)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=330)
    starts = counts(workers, "start")
    assert all(starts[i] == 1 for i in items), {i: n for i, n in starts.items() if n != 1}
    assert stored_dead_letters(brokers) == 0, "no dead letter the tasks did not cause"


def test_a_countdown_held_past_the_consumer_timeout_runs_once_and_nothing_is_lost(
    limited, consumer_timeout, redis_url, client, eo_worker
):
    brokers = limited
    app = client(conf=QUORUM, task_options=DEFAULTS)
    worker = eo_worker(task_options=DEFAULTS, extra_env=QUORUM_ENV)
    app.tasks["eo.record"].apply_async((1,), countdown=75)
    items = list(range(2, 12))
    for item in items:
        app.tasks["eo.record"].delay(item)
    assert wait_until(lambda: set(counts([worker])) >= set(items), timeout=30)
    # the held countdown outlives the 5 s timeout: its channel is closed (within a minute)
    # and its copies come back; the worker holds them again
    assert wait_until(lambda: counts([worker])[1] == 1, timeout=150)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=60)
    assert counts([worker], "start") == dict.fromkeys([1, *items], 1)
    assert stored_dead_letters(brokers) == 0
    assert "closed a channel" in worker.log_text(), "the consumer timeout struck, and was met"
