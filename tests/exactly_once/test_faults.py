"""Faults: a worker killed mid-task, a broker killed mid-run, Redis restarted mid-run."""

from __future__ import annotations

import time

from tests.exactly_once.conftest import counts
from tests.harness.waiting import wait_until


def _drained(brokers, queue: str = "celery") -> bool:
    for node in brokers.nodes:
        if not node.is_running:
            return False
        ready, unacked = node.queue_depths(brokers.vhost).get(queue, (0, 0))
        if ready or unacked:
            return False
    return True


def test_worker_killed_mid_task_is_taken_over_after_its_lease_and_completes_once(
    brokers, client, eo_worker
):
    options = {"timeout": 3, "attempts": 2, "exceptions": 1}
    app = client(task_options=options)
    doomed = eo_worker(task_options=options)
    app.tasks["eo.record"].delay(1, 30)
    assert wait_until(lambda: counts([doomed], "start")[1] == 1, timeout=15)
    doomed.kill()
    killed_at = time.time()
    heir = eo_worker(task_options=options, extra_env={"BEETLE_TEST_SLOW": "0"})
    assert wait_until(lambda: counts([heir])[1] == 1, timeout=20)
    (finished_at,) = [t for e, i, _, t in heir.events() if e == "done" and i == 1]
    started_before = next(t for e, i, _, t in doomed.events() if e == "start")
    assert finished_at >= started_before + 3, "the heir waited for the dead run's lease"
    assert finished_at > killed_at
    assert counts([doomed, heir]) == {1: 1}
    assert wait_until(lambda: _drained(brokers), timeout=15)


def test_broker_killed_and_restarted_mid_run_redelivers_copies_that_are_dropped(
    brokers, client, eo_worker
):
    app = client()
    worker = eo_worker(pool="prefork", concurrency=2)
    items = list(range(30))
    for item in items:
        app.tasks["eo.record"].delay(item, 0.1)
    assert wait_until(lambda: len(counts([worker])) >= 5, timeout=20)
    brokers.nodes[0].kill()
    time.sleep(1.0)
    brokers.nodes[0].start()
    assert wait_until(lambda: set(counts([worker])) == set(items), timeout=40)
    assert wait_until(lambda: _drained(brokers), timeout=30)
    assert counts([worker], "start") == dict.fromkeys(items, 1)
    assert worker.alive()


def test_redis_killed_mid_run_holds_completions_until_it_returns_and_nothing_runs_twice(
    brokers, redis_aof, client, eo_worker
):
    app = client()
    worker = eo_worker(redis=redis_aof.url, pool="prefork", concurrency=2)
    items = list(range(20))
    for item in items:
        app.tasks["eo.record"].delay(item, 0.1)
    assert wait_until(lambda: len(counts([worker])) >= 5, timeout=20)
    redis_aof.kill()
    time.sleep(1.0)
    done_while_down = len(counts([worker]))
    time.sleep(1.5)
    assert len(counts([worker])) <= done_while_down + 2, "no new runs without Redis"
    redis_aof.start()
    assert wait_until(lambda: set(counts([worker])) == set(items), timeout=40)
    assert wait_until(lambda: _drained(brokers), timeout=30)
    assert counts([worker], "start") == dict.fromkeys(items, 1)
    log = worker.log_text()
    # the outage was noticed: by a completion waiting for Redis, or by the gate or a claim
    assert any(
        sign in log
        for sign in (
            "retrying until Redis takes it",
            "cannot store a completion yet",
            "dedup store is unreachable",
            "cannot claim",
        )
    ), log[-3000:]


def test_redis_down_pauses_the_gate_and_it_resumes_when_redis_answers(
    brokers, redis_aof, client, eo_worker
):
    app = client()
    worker = eo_worker(redis=redis_aof.url)
    app.tasks["eo.record"].delay(0)
    assert wait_until(lambda: counts([worker])[0] == 1)
    assert wait_until(lambda: _drained(brokers)), "completion stored, both copies acked"
    redis_aof.kill()
    items = list(range(1, 11))
    for item in items:
        app.tasks["eo.record"].delay(item)
    time.sleep(2.5)
    assert set(counts([worker], "start")) == {0}, "nothing starts without a claim"
    assert "dedup store is unreachable" in worker.log_text()
    redis_aof.start()
    assert wait_until(lambda: set(counts([worker])) == {0, *items}, timeout=30)
    assert wait_until(lambda: _drained(brokers), timeout=30)
    assert counts([worker], "start") == dict.fromkeys([0, *items], 1)
    assert "answers again" in worker.log_text()
