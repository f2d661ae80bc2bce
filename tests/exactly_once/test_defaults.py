"""The promise at the task options' defaults (``attempts=1``, the default lease and prefetch).

- ``attempts`` counts body starts: a delivery the gate claimed but whose body never began
  (it waited in the pool's queue when its worker was killed) uses no attempt, and another
  worker runs it within seconds, not after the dead worker's 300 s lease, whatever the pool;
- ``acks_late=False`` (Celery acks before the body) still stores each success once;
- ``worker_prefetch_multiplier = 0`` (no prefetch limit) runs each message once.
"""

from __future__ import annotations

import json
import time

import pytest

from celery_beetle.store import RedisStore
from celery_beetle.store.state import Status
from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts

#: BeetleTask's defaults, spelled out (tests/exactly_once/app.py defaults to attempts=3)
DEFAULTS = {"timeout": 300, "attempts": 1, "exceptions": 0, "retry_delay": 10, "max_delay": 600}


def _records(redis_url: str, task_ids: dict[int, str]) -> dict[int, object]:
    store = RedisStore.from_url(redis_url)
    return {item: store.peek("celery", task_id) for item, task_id in task_ids.items()}


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_deliveries_waiting_in_a_killed_workers_pool_use_no_attempt_and_run_elsewhere_at_once(
    brokers, redis_url, client, eo_worker, pool
):
    app = client(task_options=DEFAULTS)
    first = eo_worker(task_options=DEFAULTS, pool=pool, concurrency=2 if pool != "solo" else 1)
    record = app.tasks["eo.record"]
    ids = {item: record.delay(item, 0.4).id for item in range(30)}
    # killed while bodies run and the rest of the prefetch window waits in its pool
    assert wait_until(lambda: len(counts([first], "start")) >= 2, timeout=30)
    first.kill()
    began = set(counts([first], "start"))
    finished_there = set(counts([first], "done"))
    second = eo_worker(task_options=DEFAULTS, pool=pool, concurrency=2 if pool != "solo" else 1)
    never_began = set(ids) - began
    killed_mid_body = began - finished_there
    # far sooner than the killed worker's 300 s leases: a claim that never began holds
    # only a short reservation
    assert wait_until(lambda: never_began <= set(counts([second], "done")), timeout=90), (
        f"not run yet: {sorted(never_began - set(counts([second], 'done')))}\n"
        + (second.log_text()[-3000:])
    )
    starts = counts([first, second], "start")
    assert all(starts[item] == 1 for item in ids), starts  # nothing ran twice
    assert "AttemptsExhausted" not in second.log_text()
    # a body's "done" line is written before its completion is stored
    assert wait_until(
        lambda: all(
            getattr(state, "status", None) is Status.COMPLETED
            for item, state in _records(redis_url, ids).items()
            if item in never_began
        ),
        timeout=30,
    )
    records = _records(redis_url, ids)
    for item in never_began:
        state = records[item]
        assert state is not None and state.status is Status.COMPLETED, (item, state)
        assert state.attempts == 1, (item, state)
    for item in began:  # attempt 1 is used; one whose completion was not stored before the
        # kill (mid-body, or right after it) waits for its 300 s lease to decide
        state = records[item]
        assert state is not None and state.attempts == 1, (item, state)
        assert state.status in (Status.COMPLETED, Status.RUNNING), (item, state)
        if item in killed_mid_body:
            assert state.status is Status.RUNNING, (item, state)


def test_acks_late_false_stores_each_success_once_and_dead_letters_nothing(
    brokers, redis_url, client, eo_worker
):
    options = {**DEFAULTS, "timeout": 3, "acks_late": False}  # leases end soon after
    app = client(task_options=options, backend=redis_url)
    worker = eo_worker(task_options=options, pool="prefork", concurrency=2, backend=redis_url)
    results = {item: app.tasks["eo.record"].delay(item) for item in range(20)}
    assert [r.get(timeout=60) for r in results.values()] == list(range(20))
    time.sleep(4)  # past every lease: a twin that found "running" would dead-letter now
    assert counts([worker], "start") == {item: 1 for item in range(20)}
    assert "AttemptsExhausted" not in worker.log_text(), worker.log_text()[-3000:]
    records = _records(redis_url, {item: r.id for item, r in results.items()})
    assert all(s is not None and s.status is Status.COMPLETED for s in records.values()), records
    assert all(r.state == "SUCCESS" for r in results.values())


def test_an_unlimited_prefetch_runs_each_message_once(brokers, redis_url, client, eo_worker):
    conf = {"worker_prefetch_multiplier": 0}
    app = client(task_options=DEFAULTS, conf=conf)
    env = {"BEETLE_TEST_CONF": json.dumps(conf)}
    worker = eo_worker(task_options=DEFAULTS, pool="prefork", concurrency=2, extra_env=env)
    ids = {item: app.tasks["eo.record"].delay(item).id for item in range(60)}
    assert wait_until(lambda: set(counts([worker])) == set(ids), timeout=60)
    records = _records(redis_url, ids)
    assert all(s is not None and s.status is Status.COMPLETED for s in records.values())
    assert counts([worker], "start") == {item: 1 for item in ids}


def test_a_solo_worker_stores_each_success_before_its_next_body_begins(
    brokers, redis_url, client, eo_worker
):
    """The solo pool runs bodies on the gate's own loop: a success whose completion waited
    for the loop's next pass waited behind the bodies handed over with it, past its lease,
    and its twin on the other worker found it "running" and dead-lettered it."""
    options = {**DEFAULTS, "timeout": 2}
    app = client(task_options=options)
    workers = [eo_worker(task_options=options, pool="solo", concurrency=1) for _ in range(2)]
    record = app.tasks["eo.record"]
    ids = {item: record.delay(item, 0.05 if item % 2 else 0.9).id for item in range(16)}
    assert wait_until(lambda: set(counts(workers, "done")) == set(ids), timeout=90)
    time.sleep(3)  # past every lease: a twin that found "running" would dead-letter now
    logs = "".join(w.log_text() for w in workers)
    assert "AttemptsExhausted" not in logs, logs[-3000:]
    assert counts(workers, "start") == {item: 1 for item in ids}
    records = _records(redis_url, ids)
    assert all(s is not None and s.status is Status.COMPLETED for s in records.values()), records
