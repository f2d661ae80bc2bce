"""A dedup Redis that answers but refuses writes, or forgets its scripts: nothing is lost.

``maxmemory 1`` with ``noeviction`` makes every write fail with "OOM command not allowed"
while reads still answer, so the gate sees the store as healthy and only the claim in the
pool fails. That error must mean "the store cannot take writes right now" (hand the message
back, unrun and unacked), never "the task failed" (acked, lost). ``SCRIPT FLUSH`` makes the
server forget the Lua scripts; the store must load them again and carry on.
"""

from __future__ import annotations

import re
import time

from celery_beetle.store import RedisStore
from celery_beetle.store.state import Status
from celery_beetle.testing.redis_faults import refusing_writes
from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import GATE_CLAIMS, counts
from tests.exactly_once.poison import celery_queue_empty, worker_restarted

TASKS = 200
REFUSAL_S = 5


def _backend(redis_url: str) -> str:
    """A result backend on the session's Redis (db 1), which keeps taking writes, so a task
    that failed because the dedup store refused a write shows as FAILURE."""
    return redis_url.rsplit("/", 1)[0] + "/1"


def _held(brokers, queue: str = "celery") -> int:
    """Copies still on the brokers, ready or unacked."""
    return sum(sum(depths.get(queue, (0, 0))) for depths in brokers.queue_depths())


def _states(results) -> dict[str, int]:
    seen: dict[str, int] = {}
    for result in results:
        seen[result.state] = seen.get(result.state, 0) + 1
    return seen


def test_a_dedup_redis_refusing_writes_for_5_s_loses_nothing_and_runs_each_task_once(
    brokers, client, eo_worker, redis_own, redis_url
):
    backend = _backend(redis_url)
    worker = eo_worker(redis=redis_own.url, pool="prefork", concurrency=2, backend=backend)
    pid = worker.proc.pid
    app = client(backend=backend)
    with refusing_writes(redis_own):
        results = [app.tasks["eo.record"].delay(i) for i in range(TASKS)]
        time.sleep(REFUSAL_S)  # the fault's duration

    def why() -> str:
        return (
            f"done {len(counts([worker]))}/{TASKS}, states {_states(results)}, "
            f"alive {worker.alive()}\n{worker.log_text()[-3000:]}"
        )

    assert wait_until(lambda: len(counts([worker])) == TASKS, timeout=30), why()
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=20), why()
    assert counts([worker], "start") == dict.fromkeys(range(TASKS), 1)
    assert counts([worker], "done") == dict.fromkeys(range(TASKS), 1)
    assert worker.alive() and worker.proc.pid == pid, why()
    assert "Unrecoverable error" not in worker.log_text()


def test_a_dedup_redis_refusing_writes_never_lets_a_task_be_acked_unrun(
    brokers, client, eo_worker, redis_own
):
    worker = eo_worker(redis=redis_own.url, pool="prefork", concurrency=2)
    app = client()
    app.tasks["eo.record"].delay(0)
    assert wait_until(lambda: counts([worker])[0] == 1, timeout=20)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=15)
    items = list(range(1, 21))
    with refusing_writes(redis_own):
        for item in items:
            app.tasks["eo.record"].delay(item)
        time.sleep(3)  # long enough for every copy to reach the worker and be tried
        started = set(counts([worker], "start")) - {0}
        held = _held(brokers)
    assert started == set(), "nothing starts without a claim"
    assert held == 2 * len(items), "every copy is still on its broker (ready or unacked)"
    assert wait_until(lambda: set(counts([worker])) == {0, *items}, timeout=30), worker.log_text()[
        -3000:
    ]
    assert counts([worker], "start") == dict.fromkeys([0, *items], 1)
    assert worker.alive() and worker_restarted(worker.log_text()) == []


def test_script_flush_5_times_during_a_stream_each_task_runs_once(
    brokers, client, eo_worker, redis_own
):
    worker = eo_worker(redis=redis_own.url, pool="prefork", concurrency=2)
    pid = worker.proc.pid
    app = client()
    batch = TASKS // 5
    with redis_own.client() as r:
        for flush in range(5):
            for item in range(flush * batch, (flush + 1) * batch):
                app.tasks["eo.record"].delay(item)
            halfway = flush * batch + batch // 2
            wait_until(lambda n=halfway: len(counts([worker])) >= n, timeout=10)
            r.script_flush()
    assert wait_until(lambda: len(counts([worker])) == TASKS, timeout=30), worker.log_text()[-3000:]
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=15)
    assert counts([worker], "start") == dict.fromkeys(range(TASKS), 1)
    assert worker.alive() and worker.proc.pid == pid


def test_a_start_the_store_refuses_hands_the_copy_back_and_it_runs_once_later(
    brokers, client, eo_worker, redis_own, redis_url
):
    """The pool's start (the attempt counted as the body begins) fails while deliveries the
    gate reserved wait for the only pool process: each such copy goes back unrun, its
    attempt unused, and runs once when the store takes writes again (``attempts=1``)."""
    defaults = {"timeout": 300, "attempts": 1, "exceptions": 0}
    # the gate claims item 0 too (not the idle pool): its completion is then the gate's to
    # store, and the pool process goes on to the next start while writes are refused
    worker = eo_worker(
        redis=redis_own.url, pool="prefork", concurrency=1, task_options=defaults,
        extra_env=GATE_CLAIMS,
    )  # fmt: skip
    app = client(task_options=defaults)
    record = app.tasks["eo.record"]
    ids = {0: record.delay(0, 2.5).id}
    assert wait_until(lambda: counts([worker], "start")[0] == 1, timeout=20)
    ids.update({item: record.delay(item, 0.1).id for item in range(1, 6)})
    time.sleep(0.5)  # reserved by the gate, waiting for the pool process
    with refusing_writes(redis_own):
        time.sleep(6)  # item 0 ends meanwhile: the next one's start is refused
    assert wait_until(lambda: set(counts([worker])) == set(ids), timeout=40), worker.log_text()[
        -3000:
    ]
    log = worker.log_text()
    # the refused start handed its copy back, counted as the gate's pause ended
    assert re.search(r"answers again after .*, [1-9]\d* handed back", log), log[-3000:]
    assert "AttemptsExhausted" not in log
    assert counts([worker], "start") == dict.fromkeys(ids, 1)
    store = RedisStore.from_url(redis_own.url)

    def records() -> dict[int, object]:
        return {item: store.peek("celery", task_id) for item, task_id in ids.items()}

    # the gate stores item 0's completion once the store takes writes again (it retries)
    assert wait_until(
        lambda: all(s is not None and s.status is Status.COMPLETED for s in records().values()),
        timeout=20,
    ), records()
    assert all(s.attempts == 1 for s in records().values()), records()  # type: ignore[attr-defined]


def test_early_acked_countdowns_coming_due_while_redis_refuses_writes_each_run_once(
    brokers, client, eo_worker, redis_own, redis_url
):
    """With ``acks_late`` off, Celery acks each copy as a pool process takes it, so a claim
    Redis refuses cannot hand the copy back: the run publishes the message again. Countdown
    tasks coming due on one worker during the refusal (both copies of each go through the
    pool: the gate claims no ETA task) were lost before; each runs once now."""
    options = {"timeout": 6, "attempts": 1, "exceptions": 0, "acks_late": False}
    backend = _backend(redis_url)
    worker = eo_worker(
        redis=redis_own.url, pool="prefork", concurrency=2, task_options=options,
        backend=backend,
    )  # fmt: skip
    app = client(task_options=options, backend=backend)
    results = [app.tasks["eo.record"].apply_async((item,), countdown=2) for item in range(4)]
    time.sleep(1)  # received: waiting in Celery's timer
    with refusing_writes(redis_own):
        time.sleep(6)  # they come due meanwhile, and every claim is refused

    def why() -> str:
        return f"done {counts([worker])}, states {_states(results)}\n{worker.log_text()[-3000:]}"

    assert wait_until(lambda: len(counts([worker], "done")) == 4, timeout=60), why()
    time.sleep(3)  # a second run would start by now
    assert counts([worker], "start") == dict.fromkeys(range(4), 1), why()
    assert "sent back to its queue" in worker.log_text(), why()
    assert "AttemptsExhausted" not in worker.log_text(), why()
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=20), why()
