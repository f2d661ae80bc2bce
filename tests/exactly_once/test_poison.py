"""Poison headers never crash a worker; a far-future expiry is clamped, not trusted.

A publisher controls every ``x-beetle-*`` header, so a message whose expiry is ``inf``, NaN,
text or a list, or whose flags are not a number, must be dead-lettered with the reason
``invalid_header`` (naming the header), while the worker's main process carries on: one
bad message must never cost the other tasks it holds. An expiry far in the future (a µs
or ns timestamp sent by mistake) is clamped: the task runs once and its dedup record still
expires.
"""

from __future__ import annotations

import struct
import uuid

import pytest
import redis

from celery_beetle.store import RedisStore
from celery_beetle.testing.waiting import wait_until
from kombu_beetle.envelope import EXPIRES_AT_HEADER
from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import (
    AMQP_MAX_MESSAGE_ID,
    POISON,
    Poison,
    celery_queue_empty,
    dead_letter_count,
    publish_poison,
    publish_raw,
    take_dead_letters,
    task_body,
    worker_restarted,
)

POOLS = [
    pytest.param({}, id="solo"),
    pytest.param({"pool": "prefork", "concurrency": 2}, id="prefork"),
]
GOOD = list(range(20))


def _dedup_key(redis_url: str, message_id: str, queue: str = "celery") -> str:
    """The Redis key of a message's dedup record (the one place that knows its shape)."""
    return RedisStore.from_url(redis_url).key(queue, message_id)


@pytest.mark.parametrize("worker_options", POOLS)
def test_poison_headers_are_dead_lettered_as_invalid_and_the_worker_never_restarts(
    brokers, client, eo_worker, worker_options
):
    worker = eo_worker(**worker_options)
    pid = worker.proc.pid
    node, vhost = brokers.nodes[0], brokers.vhost
    sent = {publish_poison(node, vhost, p, 1000 + n): (p, 1000 + n) for n, p in enumerate(POISON)}
    app = client()
    for item in GOOD:
        app.tasks["eo.record"].delay(item)

    assert _wait_while_alive(worker, lambda: set(counts([worker])) >= set(GOOD)), _why(worker)
    must_dead = sum(not p.may_run for p, _ in sent.values())
    assert _wait_while_alive(worker, lambda: dead_letter_count(brokers) >= must_dead), _why(worker)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=15), _why(worker)
    assert worker.alive() and worker.proc.pid == pid, _why(worker)
    assert worker_restarted(worker.log_text()) == [], _why(worker)
    starts = counts([worker], "start")
    assert {i: starts[i] for i in GOOD} == dict.fromkeys(GOOD, 1)
    dead = take_dead_letters(brokers)
    for task_id, (poison, item) in sent.items():
        _assert_dead_lettered_once(poison, dead.get(task_id, []), starts[item])


@pytest.mark.parametrize("poison", POISON, ids=[p.label for p in POISON])
def test_each_poison_header_alone_is_dead_lettered_naming_it(brokers, client, eo_worker, poison):
    """One poison message at a time, so that each header's failure shows on its own."""
    worker = eo_worker()
    task_id = publish_poison(brokers.nodes[0], brokers.vhost, poison, 500)
    client().tasks["eo.record"].delay(1)
    assert _wait_while_alive(worker, lambda: counts([worker])[1] == 1), _why(worker, brokers)

    def settled() -> bool:  # dead-lettered or run, and nothing left in the queue
        handled = dead_letter_count(brokers) >= 1 or counts([worker], "start")[500] >= 1
        return handled and celery_queue_empty(brokers)

    assert _wait_while_alive(worker, settled, timeout=15), _why(worker, brokers)
    assert worker.alive() and worker_restarted(worker.log_text()) == [], _why(worker)
    dead = take_dead_letters(brokers)
    _assert_dead_lettered_once(poison, dead.get(task_id, []), counts([worker], "start")[500])


def _assert_dead_lettered_once(poison: Poison, letters: list[dict], starts: int) -> None:
    if poison.may_run and not letters:
        assert starts == 1, f"{poison.label}: neither run once nor dead-lettered"
        return
    assert len(letters) == 1, f"{poison.label}: {len(letters)} dead letters, {starts} runs"
    assert starts == 0, f"{poison.label}: ran and was dead-lettered"
    (headers,) = letters
    assert headers.get("x-beetle-dead-reason") == "invalid_header", (poison.label, headers)
    assert poison.header in str(headers.get("x-beetle-dead-message")), (poison.label, headers)


def _wait_while_alive(worker, predicate, timeout: float = 25) -> bool:
    """Wait for ``predicate``, but give up at once if the worker died."""
    return wait_until(lambda: not worker.alive() or predicate(), timeout=timeout) and predicate()


def _why(worker, brokers=None) -> str:
    depths = brokers.queue_depths() if brokers else ""
    return f"worker alive: {worker.alive()}, queues {depths}\n{worker.log_text()[-4000:]}"


def test_a_message_id_of_the_amqp_maximum_length_runs_once(brokers, client, eo_worker):
    """A ``message_id`` over 1024 bytes cannot reach a worker at all: AMQP carries it as a
    ``shortstr`` of at most 255 bytes. The longest one it can carry is legal and runs."""
    worker = eo_worker()
    longest = ("m" + uuid.uuid4().hex * 8)[:AMQP_MAX_MESSAGE_ID]
    publish_raw(brokers.nodes[0], brokers.vhost, body=task_body(7), message_id=longest)
    with pytest.raises(struct.error):  # py-amqp cannot encode a longer one
        publish_raw(brokers.nodes[0], brokers.vhost, body=task_body(8), message_id=longest + "x")
    client().tasks["eo.record"].delay(9)
    assert wait_until(lambda: {7, 9} <= set(counts([worker])), timeout=20), worker.log_text()
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=10)
    assert counts([worker], "start") == {7: 1, 9: 1}
    assert worker.alive()


@pytest.mark.parametrize("expires_at_s", [10**14, 10**15, 10**17], ids=["1e14", "1e15", "1e17"])
def test_a_far_future_expiry_is_clamped_so_the_task_runs_once_and_its_record_expires(
    brokers, client, eo_worker, redis_url, expires_at_s
):
    worker = eo_worker(pool="prefork", concurrency=2)
    pid = worker.proc.pid
    message_id = f"far-{expires_at_s}-{uuid.uuid4().hex[:8]}"
    for copy in brokers.nodes[:2]:  # both copies of a redundant message
        publish_raw(
            copy, brokers.vhost, body=task_body(1), message_id=message_id,
            **{EXPIRES_AT_HEADER: expires_at_s, "x-beetle-flags": 1},
        )  # fmt: skip
    assert _wait_while_alive(worker, lambda: counts([worker])[1] == 1), _why(worker)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=15), _why(worker)
    ttl_ms = redis.Redis.from_url(redis_url).pttl(_dedup_key(redis_url, message_id))
    assert ttl_ms > 0, f"the dedup record must expire (PTTL {ttl_ms})"

    app = client()
    for item in range(2, 7):
        app.tasks["eo.record"].delay(item)
    assert wait_until(lambda: set(counts([worker])) == set(range(1, 7)), timeout=20)
    assert counts([worker], "start") == dict.fromkeys(range(1, 7), 1)
    assert worker.alive() and worker.proc.pid == pid
    assert take_dead_letters(brokers) == {}
