"""Runs on the gate's claim (the pool makes no round trip), on real brokers and Redis.

The gate claims a delivery in its batch and stores the completion before the ack, unless a
prefork process is free for it: then the pool claims as the body begins
(``beetle_claim_in_idle_pool``, on by default). The tests of the gate's claim turn that off,
so that each delivery takes the gate's claim whether the pool is busy or not. These are the
two places where the gate's claim could go wrong, each run with the prefork pool:

- a delivery that waited in the pool longer than the gate's reservation, or its lease's
  margin, must not start on it (its time limit would end after it): the pool's start gives
  it the full lease as the body begins, and the run is still the message's first attempt;
- a body that succeeded, and then Celery failed the run (a result the backend cannot
  encode): the main process sees a failure and acks without a completion, so the pool
  stores the completion itself; the message must not run again when the lease runs out.
"""

from __future__ import annotations

import json
import time

import redis

from celery_beetle.store import RedisStore
from celery_beetle.store.state import Status
from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import GATE_CLAIMS, counts


def _evalsha_calls(redis_url: str) -> int:
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def _calls_one_after_the_other(brokers, redis_url: str, app, worker) -> tuple[int, list]:
    """The scripts' calls (``EVALSHA``) of 5 messages sent one after the other, each run and
    both its copies gone before the next (after one to load the scripts and open the
    pool's connections), and their results."""
    record = app.tasks["eo.record"]
    record.delay(100)
    assert wait_until(lambda: counts([worker])[100] == 1, timeout=20)
    assert wait_until(lambda: _drained(brokers), timeout=15)
    before = _evalsha_calls(redis_url)
    results = []
    for item in range(5):
        results.append(record.delay(item))
        assert wait_until(lambda item=item: counts([worker])[item] == 1, timeout=20)
        assert wait_until(lambda: _drained(brokers), timeout=15)
    return _evalsha_calls(redis_url) - before, results


def _drained(brokers, queue: str = "celery") -> bool:
    return all(depths.get(queue, (1, 1)) == (0, 0) for depths in brokers.queue_depths())


def _record(redis_url: str, task_id: str):
    return RedisStore.from_url(redis_url).peek("celery", task_id)


def test_a_delivery_that_waited_in_the_pool_starts_on_a_full_lease_and_runs_once(
    brokers, redis_url, client, eo_worker
):
    options = {"timeout": 4}  # a 3.5 s time limit: a run may wait 0.5 s before it starts
    app = client(task_options=options)
    worker = eo_worker(task_options=options, pool="prefork", concurrency=1, extra_env=GATE_CLAIMS)
    record = app.tasks["eo.record"]
    first = record.delay(0, 1.0)
    later = [record.delay(item) for item in (1, 2, 3)]  # wait in the pool behind it
    assert wait_until(lambda: set(counts([worker])) == {0, 1, 2, 3}, timeout=30), worker.log_text()[
        -3000:
    ]
    assert wait_until(lambda: _drained(brokers), timeout=15)
    time.sleep(4.5)  # past every lease: nothing runs again
    assert counts([worker], "start") == {0: 1, 1: 1, 2: 1, 3: 1}
    for result in (first, *later):
        state = _record(redis_url, result.id)
        assert state.status is Status.COMPLETED and state.attempts == 1, state


def test_a_run_celery_fails_after_its_body_succeeded_is_completed_and_never_runs_again(
    brokers, redis_url, client, eo_worker
):
    options = {"timeout": 2}
    app = client(task_options=options, backend=redis_url)
    worker = eo_worker(
        task_options=options, pool="prefork", concurrency=1, backend=redis_url,
        extra_env=GATE_CLAIMS,
    )  # fmt: skip
    result = app.tasks["eo.unencodable"].delay(7)
    assert wait_until(lambda: counts([worker])[7] == 1, timeout=20)
    assert wait_until(lambda: _drained(brokers), timeout=15)
    assert _record(redis_url, result.id).status is Status.COMPLETED
    assert "Celery failed the run" in worker.log_text()
    time.sleep(2.5)  # past the lease
    assert counts([worker], "start") == {7: 1}


def test_the_gates_completed_event_names_the_pool_process_that_started_the_run(
    brokers, redis_url, client, eo_worker, tmp_path
):
    traces = tmp_path / "trace"
    app = client()
    worker = eo_worker(pool="prefork", concurrency=2, trace_dir=str(traces), extra_env=GATE_CLAIMS)
    ids = {app.tasks["eo.record"].delay(item).id for item in range(6)}
    assert wait_until(lambda: len(counts([worker])) == 6, timeout=20)
    assert wait_until(lambda: _drained(brokers), timeout=15)
    worker.stop()  # flushes every process's trace

    runs: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for path in traces.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["event"] in ("started", "completed") and event["message_id"] in ids:
                key = (event["message_id"], event["event"])
                runs.setdefault(key, []).append((event["pid"], event["attempt"]))
    for message_id in ids:
        assert runs[(message_id, "started")] == runs[(message_id, "completed")], message_id


def test_a_copy_that_finds_a_process_free_is_claimed_in_the_pool_with_two_calls_a_pair(
    brokers, redis_url, client, eo_worker
):
    """One after the other, each message finds a prefork process free: the gate hands it on
    unclaimed, the pool claims it as the body begins and completes it, and the other copy
    waits in the gate and is dropped with no call: two round trips a message, not three."""
    worker = eo_worker(pool="prefork", concurrency=2)
    calls, results = _calls_one_after_the_other(brokers, redis_url, client(), worker)
    assert calls == 2 * 5, "a claim and a completion each"
    assert counts([worker], "start") == {100: 1, **dict.fromkeys(range(5), 1)}
    for result in results:
        state = _record(redis_url, result.id)
        assert state.status is Status.COMPLETED and state.attempts == 1, state


def test_with_the_gate_claiming_first_a_pair_costs_three_calls(
    brokers, redis_url, client, eo_worker
):
    worker = eo_worker(pool="prefork", concurrency=2, extra_env=GATE_CLAIMS)
    calls, _ = _calls_one_after_the_other(brokers, redis_url, client(), worker)
    assert calls == 3 * 5, "the gate's claim, the start and the completion of each"
