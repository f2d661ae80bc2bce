"""A deploy while Redis is down: the worker's warm shutdown stores what it owes first.

A run that succeeded on the gate's claim is acked only once its completion is stored. When
Redis refuses writes at the moment a deploy stops the worker (SIGTERM), those completions
are owed; the worker keeps trying to store them for ``beetle_shutdown_store_wait`` seconds
before it lets the connection go, so a body that returned is not found unfinished (and, at
``attempts=1``, dead-lettered) by the next worker.
"""

from __future__ import annotations

import threading
import time

import pytest

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import celery_queue_empty, stored_dead_letters
from tests.exactly_once.test_defaults import DEFAULTS


@pytest.mark.timeout(300)
def test_a_warm_shutdown_during_a_redis_outage_stores_its_completions_once_redis_is_back(
    brokers, redis_aof, client, eo_worker
):
    app = client(task_options=DEFAULTS)
    options = {"task_options": DEFAULTS, "redis": redis_aof.url}
    options["pool"], options["concurrency"] = "prefork", 2
    worker = eo_worker(**options)
    items = list(range(120))
    for item in items:
        app.tasks["eo.record"].delay(item, 0.1)
    assert wait_until(lambda: len(counts([worker])) >= 30, timeout=60)
    redis_aof.kill()
    time.sleep(2)  # the bodies running now return; their completions cannot be stored
    stopping = threading.Thread(target=worker.stop, kwargs={"timeout": 90})
    stopping.start()  # a deploy: SIGTERM while Redis is down
    time.sleep(5)
    assert worker.alive(), "the worker waits for the store before it lets its deliveries go"
    redis_aof.start()
    stopping.join()
    log = worker.log_text()
    assert "beetle: stopping: stored the" in log, log[-3000:]
    successor = eo_worker(**options)
    workers = [worker, successor]
    assert wait_until(lambda: set(counts(workers)) == set(items), timeout=120), (
        f"not run: {sorted(set(items) - set(counts(workers)))[:20]}"
    )
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=60), (
        "a copy whose body returned before the shutdown was not found completed"
    )
    starts = counts(workers, "start")
    assert all(starts[i] == 1 for i in items), {i: n for i, n in starts.items() if n != 1}
    assert stored_dead_letters(brokers) == 0, "no dead letter the tasks did not cause"


@pytest.mark.timeout(240)
def test_a_task_that_returns_during_a_warm_shutdown_is_completed_before_its_lease_runs_out(
    brokers, client, eo_worker
):
    """Celery's warm shutdown closes the consumer, then waits for its pool: a short task that
    returned meanwhile used to be completed only when the longest one ended, past its own
    lease, and the worker holding its twin ran it again. The leaving worker consumes one broker
    here, so the twins wait on the second until the first worker is told to stop. (A copy
    acked as the worker leaves may come back: its record says it completed.)"""
    options = {"task_options": {"timeout": 3}, "pool": "threads", "concurrency": 3}
    app = client(brokers.url_for(0, 1), task_options={"timeout": 3})
    leaving = eo_worker(brokers.url_for(0), **options)
    app.tasks["eo.record"].delay(0, 9.0)  # holds the shutdown for 9 s, its lease kept
    assert wait_until(lambda: counts([leaving], "start")[0] == 1, timeout=30)
    for item in (1, 2):
        app.tasks["eo.record"].delay(item, 1.0)
    assert wait_until(lambda: counts([leaving], "start")[2] == 1, timeout=30)
    stopping = threading.Thread(target=leaving.stop, kwargs={"timeout": 60})
    stopping.start()  # a deploy: SIGTERM while the three bodies run
    staying = eo_worker(brokers.url_for(0, 1), **options)  # the twins wait here, leased
    stopping.join()
    workers = [leaving, staying]
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=60), brokers.queue_depths()
    assert counts(workers, "start") == {0: 1, 1: 1, 2: 1}, leaving.log_text()[-3000:]


@pytest.mark.timeout(300)
def test_redis_failing_while_a_warm_shutdown_stores_completions_leaves_each_body_run_once(
    brokers, redis_aof, client, eo_worker
):
    """Redis dies in the middle of a deploy's warm shutdown: bodies return one by one, the
    first completions are stored as they come, the next meet the outage, and Redis is back
    before the last body returns. The worker stores every completion owed before it lets
    its deliveries go, so the next worker runs none of them again."""
    app = client(task_options=DEFAULTS)
    options = {"task_options": DEFAULTS, "redis": redis_aof.url}
    options["pool"], options["concurrency"] = "threads", 6
    worker = eo_worker(**options)
    items = list(range(6))
    for item in items:
        app.tasks["eo.record"].delay(item, 1.5 + item)  # returning 1 s apart
    assert wait_until(lambda: len(counts([worker], "start")) == len(items), timeout=60)
    stopping = threading.Thread(target=worker.stop, kwargs={"timeout": 90})
    stopping.start()  # a deploy: SIGTERM while the six bodies run
    assert wait_until(lambda: len(counts([worker])) >= 1, timeout=10), "a body returned"
    redis_aof.kill()  # during the shutdown's stores: the next bodies return into an outage
    time.sleep(2.5)
    assert worker.alive(), "the worker waits for the store before it lets its deliveries go"
    redis_aof.start()
    stopping.join()
    assert set(counts([worker])) == set(items), "every body returned in the leaving worker"
    successor = eo_worker(**options)
    workers = [worker, successor]
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=60), (
        "a copy whose body returned during the shutdown was not found completed\n"
        + worker.log_text()[-3000:]
    )
    starts = counts(workers, "start")
    assert all(starts[i] == 1 for i in items), {i: n for i, n in starts.items() if n != 1}
    assert stored_dead_letters(brokers) == 0, "no dead letter the tasks did not cause"
