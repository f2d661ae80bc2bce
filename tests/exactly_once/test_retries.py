"""Failures: backoff through delay queues, dead letters, and fenced late completions."""

from __future__ import annotations

import redis
from celery.result import AsyncResult

from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import death_of, take_dead_letters
from tests.harness.waiting import wait_until


def _dead_letters(brokers, queue: str = "celery.dead") -> list:
    """Drain ``queue`` on every node: one (method, properties, body) per dead letter, its
    copies on two brokers counted once."""
    found, seen = [], set()
    for node, depths in zip(brokers.nodes, brokers.queue_depths(), strict=True):
        if queue in depths:
            for message in node.get_messages(brokers.vhost, queue):
                if death_of(message[1].headers) not in seen:
                    seen.add(death_of(message[1].headers))
                    found.append(message)
    return found


def _backend(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0] + "/1"


def _starts(worker, item: int) -> list[float]:
    return sorted(t for e, i, _, t in worker.events() if e == "start" and i == item)


def test_retries_back_off_and_stop_at_attempts_then_dead_letter(
    brokers, redis_url, client, eo_worker
):
    options = {"attempts": 3, "exceptions": 2, "retry_delay": 0.6, "max_delay": 5}
    backend = _backend(redis_url)
    app = client(task_options=options, backend=backend)
    worker = eo_worker(task_options=options, backend=backend)
    result = app.tasks["eo.flaky"].delay(1)
    assert wait_until(lambda: AsyncResult(result.id, app=app).state == "FAILURE", timeout=15)
    starts = _starts(worker, 1)
    assert len(starts) == 3
    assert starts[1] - starts[0] >= 0.55, "first retry after delay"
    assert starts[2] - starts[1] >= 1.15, "second retry after 2 * delay"
    dead = _dead_letters(brokers)
    assert len(dead) == 1
    _, properties, _ = dead[0]
    headers = properties.headers
    assert properties.message_id == result.id
    assert headers["x-beetle-dead-reason"] == "attempts_limit"
    assert headers["x-beetle-dead-queue"] == "celery"
    assert headers["x-beetle-dead-exception"] == "builtins.RuntimeError"
    assert "fails every time" in headers["x-beetle-dead-message"]
    assert headers["x-beetle-dead-attempts"] == 3
    assert headers["task"] == "eo.flaky"
    assert len(_starts(worker, 1)) == 3, "no run after giving up"
    queues = brokers.nodes[0].queue_depths(brokers.vhost)
    assert any(name.startswith("celery.delay.") for name in queues), "delay queues were used"


def test_exception_outside_retry_on_is_dead_lettered_at_once_and_recorded_as_failure(
    brokers, redis_url, client, eo_worker
):
    backend = _backend(redis_url)
    app = client(backend=backend)
    worker = eo_worker(backend=backend)
    result = app.tasks["eo.picky"].delay(2)
    assert wait_until(lambda: AsyncResult(result.id, app=app).state == "FAILURE", timeout=20)
    assert wait_until(lambda: len(_starts(worker, 2)) == 1)
    dead = _dead_letters(brokers)
    assert len(dead) == 1
    _, properties, body = dead[0]
    headers = properties.headers
    assert headers["x-beetle-dead-reason"] == "not_retryable"
    assert headers["x-beetle-dead-exception"] == "builtins.KeyError"
    assert "test" not in headers["x-beetle-dead-traceback"] or headers["x-beetle-dead-traceback"]
    assert headers["x-beetle-dead-flags"] & 1
    assert b"[2]" in body
    state = redis.Redis.from_url(redis_url, decode_responses=True).hgetall(
        f"beetle:{{celery:{result.id}}}"
    )
    assert state["s"] == "f"
    assert len(_starts(worker, 2)) == 1


def test_a_body_that_outlives_its_lease_in_the_solo_pool_keeps_it_and_runs_once(
    brokers, redis_url, client, eo_worker
):
    # each worker sees one copy (one broker each); the solo pool cannot enforce time limits,
    # so the run's lease keeper extends its 2 s lease while the 3.5 s body runs, and the
    # other worker's copy waits for it instead of taking the message over
    options = {"timeout": 2, "attempts": 2, "exceptions": 1}
    app = client(url=brokers.url_for(0, 1), task_options=options)
    first = eo_worker(url=brokers.url_for(0), task_options=options)
    second = eo_worker(url=brokers.url_for(1), task_options=options)
    result = app.tasks["eo.record"].delay(3, 3.5)
    assert wait_until(lambda: counts([first, second])[3] == 1, timeout=25)
    assert wait_until(lambda: _all_drained(brokers), timeout=15)
    assert counts([first, second], "start") == {3: 1}
    state = redis.Redis.from_url(redis_url, decode_responses=True).hgetall(
        f"beetle:{{celery:{result.id}}}"
    )
    assert (state["s"], state["t"]) == ("c", "1"), "the one claim's token completed"


def _all_drained(brokers, queue: str = "celery") -> bool:
    return all(depths.get(queue, (0, 0)) == (0, 0) for depths in brokers.queue_depths())


def test_time_limits_derived_from_the_lease_stop_a_run_before_its_lease_ends(
    brokers, client, eo_worker
):
    # lease 2 s: soft limit 1 s, hard 1.5 s; the body wants 5 s, so every run is cut short
    options = {"timeout": 2, "attempts": 2, "exceptions": 1, "retry_delay": 0.5}
    app = client(task_options=options)
    worker = eo_worker(task_options=options, pool="prefork", concurrency=1)
    app.tasks["eo.record"].delay(9, 5)
    assert wait_until(lambda: len(_dead_letters_peek(brokers)) == 1, timeout=25)
    starts = _starts(worker, 9)
    assert len(starts) == 2
    assert starts[1] - starts[0] < 2.5, "the first run was stopped at its soft limit"
    assert counts([worker])[9] == 0, "no run finished its body"
    (headers,) = _dead_letters_peek(brokers)
    assert headers["x-beetle-dead-reason"] == "attempts_limit"
    assert headers["x-beetle-dead-exception"].endswith("SoftTimeLimitExceeded")


def _dead_letters_peek(brokers, queue: str = "celery.dead") -> list[dict]:
    """The dead letters' headers (copies counted once), leaving them in place."""
    return [h for hs in take_dead_letters(brokers, queue, ack=False).values() for h in hs]
