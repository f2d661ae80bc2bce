"""Faults: a worker killed mid-task, a broker killed mid-run, Redis restarted mid-run."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import ROOT, counts


def _drained(brokers, queue: str = "celery") -> bool:
    if not all(node.is_running for node in brokers.nodes):
        return False
    return all(depths.get(queue, (0, 0)) == (0, 0) for depths in brokers.queue_depths())


# The first two run on the pytest plugin's fixtures (celery_beetle.pytest_plugin), as a user's
# test would, with this package's test app; the verdict is the trace's, by the naive audit.
LEASE = {"timeout": 3, "attempts": 2, "exceptions": 1}


@pytest.fixture
def beetle_app_path() -> str:
    return "tests.exactly_once.app:app"


@pytest.fixture
def beetle_worker_options(tmp_path) -> dict[str, Any]:
    env = {"BEETLE_TEST_TASK": json.dumps(LEASE), "BEETLE_TEST_OUT": str(tmp_path / "runs.out")}
    return {"env": env, "root": ROOT}


def _runs(tmp_path) -> list[tuple[str, int, int, float]]:
    lines = (tmp_path / "runs.out").read_text().splitlines()
    return [(e, int(i), int(p), float(t)) for e, i, p, t in (line.split() for line in lines)]


def test_worker_killed_mid_task_is_taken_over_after_its_lease_and_completes_once(
    beetle_setup, beetle_worker_factory, tmp_path
):
    beetle_setup.app.tasks["eo.record"].delay(1, 30)
    doomed = beetle_setup.worker
    assert len(doomed.kill_mid_task(timeout=15)) == 1
    killed_at = time.time()
    beetle_worker_factory(env={"BEETLE_TEST_SLOW": "0"})  # the heir does not sleep 30 s
    beetle_setup.assert_exactly_once(expected=1, timeout=30)
    runs = _runs(tmp_path)
    started_before = next(t for e, _, p, t in runs if e == "start" and p == doomed.pid)
    (finished_at,) = [t for e, i, _, t in runs if e == "done" and i == 1]
    assert finished_at >= started_before + LEASE["timeout"], "the heir waited for the lease"
    assert finished_at > killed_at


def test_broker_killed_and_restarted_mid_run_redelivers_copies_that_are_dropped(
    beetle_setup, beetle_worker_factory, tmp_path
):
    worker = beetle_worker_factory(pool="prefork", concurrency=2)
    beetle_setup.worker.stop()  # the setup's solo worker: this test wants a prefork one
    items = list(range(30))
    for item in items:
        beetle_setup.app.tasks["eo.record"].delay(item, 0.1)
    assert wait_until(lambda: beetle_setup.verdict().counts["completed_once"] >= 5, timeout=20)
    broker = beetle_setup.broker_cluster[0]
    broker.kill()
    time.sleep(1.0)
    broker.restart()
    assert wait_until(lambda: beetle_setup.verdict().counts["completed_once"] == 30, timeout=40)
    assert wait_until(lambda: _drained_cluster(beetle_setup.broker_cluster), timeout=30)
    assert worker.ready()
    beetle_setup.assert_exactly_once(expected=30)
    assert Counter(i for e, i, _, _ in _runs(tmp_path) if e == "start") == dict.fromkeys(items, 1)


def _drained_cluster(cluster, queue: str = "celery") -> bool:
    for broker in cluster:
        if not broker.ready():
            return False
        ready, unacked = broker.queue_depths().get(queue, (0, 0))
        if ready or unacked:
            return False
    return True


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
            "is unreachable",
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
    assert f"dedup store {redis_aof.url} is unreachable" in worker.log_text()
    redis_aof.start()
    assert wait_until(lambda: set(counts([worker])) == {0, *items}, timeout=30)
    assert wait_until(lambda: _drained(brokers), timeout=30)
    assert counts([worker], "start") == dict.fromkeys([0, *items], 1)
    assert "answers again" in worker.log_text()
