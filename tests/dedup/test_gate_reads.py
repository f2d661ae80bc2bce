"""The gate's pipelined reads on kombu's event loop, against a real Redis.

What the worker relies on: the reads of one loop pass go out as one round trip, each reply
reaches its own delivery, and every fault (Redis killed, Redis frozen, the loop reset under
a consumer restart) ends with each pending read answered by an error, never a hang.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kombu.asynchronous import Hub

from celery_beetle.store import RedisStore, wall_clock_ms
from celery_beetle.store.outcome import Claim, Limits
from celery_beetle.store.state import MessageFacts, Status
from celery_beetle.worker.gate_reads import PipelinedReads, pipelined_reads_for

pytestmark = pytest.mark.integration


def facts(n: int) -> MessageFacts:
    return MessageFacts("celery", f"m-{n}", expires_at_ms=wall_clock_ms() + 60_000)


def spin(hub: Hub, until: Any, timeout: float = 5.0) -> None:
    """Run the event loop until ``until()`` is true."""
    loop = hub.create_loop()
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the loop did not get there in time"
        next(loop)


def first_answer(reads: PipelinedReads, hub: Hub) -> list[Any]:
    """Read once (connecting); return the list later answers are appended to."""
    answers: list[Any] = []
    reads.read(facts(1), lambda state, exc: answers.append((state, exc)))
    spin(hub, lambda: answers)
    assert answers == [(None, None)]
    return answers


@pytest.fixture
def hub() -> Any:
    hub = Hub()
    yield hub
    hub.close()


def test_reads_of_one_loop_pass_go_out_as_one_round_trip_and_each_gets_its_record(redis_url, hub):
    store = RedisStore.from_url(redis_url)
    claimed = store.claim(facts(1), Limits(60_000), "w1")
    store.complete(facts(2), store.claim(facts(2), Limits(60_000), "w1").token)
    reads = pipelined_reads_for(store, hub, 2.0)
    assert isinstance(reads, PipelinedReads)
    before = store.round_trips
    answers: dict[int, Any] = {}
    for n in (1, 2, 3):
        reads.read(facts(n), lambda state, exc, n=n: answers.setdefault(n, (state, exc)))
    spin(hub, lambda: len(answers) == 3)
    assert store.round_trips - before == 1
    assert answers[1][0].status is Status.RUNNING and answers[1][0].token == claimed.token
    assert answers[2][0].status is Status.COMPLETED
    assert answers[3] == (None, None)
    reads.close()


def test_a_record_under_its_old_key_is_read_in_the_same_round_trip(redis_url, hub):
    store = RedisStore.from_url(redis_url)
    limits = Limits(60_000)
    old_form = MessageFacts("a:b", "c", expires_at_ms=wall_clock_ms() + 60_000)
    new_form = MessageFacts("a:b", "d", expires_at_ms=wall_clock_ms() + 60_000)
    old_key = store.legacy_key("a:b", "c")
    assert old_key == "beetle:{a:b:c}"
    store.client.hset(old_key, mapping={"s": "c", "a": 1, "t": 1})  # the previous version's
    store.complete(new_form, store.claim(new_form, limits, "w1").token)
    reads = pipelined_reads_for(store, hub, 2.0)
    assert isinstance(reads, PipelinedReads)
    before = store.round_trips
    answers: dict[str, Any] = {}
    for msg in (old_form, new_form, facts(9)):
        reads.read(msg, lambda state, exc, m=msg: answers.setdefault(m.message_id, (state, exc)))
    spin(hub, lambda: len(answers) == 3)
    assert store.round_trips - before == 1
    assert answers["c"][0].status is Status.COMPLETED and answers["c"][0].token == 1
    assert answers["d"][0].status is Status.COMPLETED
    assert answers["m-9"] == (None, None)
    reads.close()


def test_a_killed_redis_answers_every_pending_read_with_an_error(redis_own, hub):
    reads = PipelinedReads(RedisStore.from_url(redis_own.url), hub, timeout_s=2.0)
    answers = first_answer(reads, hub)
    redis_own.kill()
    reads.read(facts(2), lambda state, exc: answers.append((state, exc)))
    reads.read(facts(3), lambda state, exc: answers.append((state, exc)))
    spin(hub, lambda: len(answers) == 3)
    assert all(state is None and exc is not None for state, exc in answers[1:])
    redis_own.start()  # the next read connects again
    reads.read(facts(4), lambda state, exc: answers.append((state, exc)))
    spin(hub, lambda: len(answers) == 4)
    assert answers[3] == (None, None)


def test_a_frozen_redis_fails_pending_reads_after_the_timeout(redis_own, hub):
    reads = PipelinedReads(RedisStore.from_url(redis_own.url), hub, timeout_s=0.5)
    answers = first_answer(reads, hub)
    redis_own.pause()
    started = time.monotonic()
    reads.read(facts(2), lambda state, exc: answers.append((state, exc)))
    spin(hub, lambda: len(answers) == 2)
    assert 0.4 < time.monotonic() - started < 3
    assert answers[1][0] is None and "no reply" in str(answers[1][1])


def test_closing_answers_pending_reads_so_a_consumer_restart_strands_none(redis_url, hub):
    reads = PipelinedReads(RedisStore.from_url(redis_url), hub)
    answers: list[Any] = []
    reads.read(facts(1), lambda state, exc: answers.append((state, exc)))
    reads._flush()  # what the loop's next pass does: written, its reply not read yet
    assert reads.pending == 1 and not answers
    reads.close()
    assert len(answers) == 1 and answers[0][1] is not None
    assert reads.pending == 0


def test_without_an_event_loop_or_a_single_connection_pool_the_gate_reads_synchronously(
    redis_url, hub
):
    from celery_beetle.store.fake import FakeStore

    assert pipelined_reads_for(RedisStore.from_url(redis_url), None, 2.0) is None
    assert pipelined_reads_for(FakeStore(), hub, 2.0) is None  # no Redis client: a test


# -- script calls: the gate's claim and completion -------------------------------------------


def test_claims_and_completions_ride_in_one_batch_each_with_its_decision(redis_url, hub):
    store = RedisStore.from_url(redis_url)
    reads = pipelined_reads_for(store, hub, 2.0)
    assert reads is not None
    limits = Limits(60_000)
    store.complete(facts(2), store.claim(facts(2), limits, "other").token)
    before = store.round_trips
    answers: dict[str, Any] = {}
    reads.claim(facts(1), limits, "gate-1", lambda d, exc: answers.setdefault("new", (d, exc)))
    reads.claim(facts(2), limits, "gate-1", lambda d, exc: answers.setdefault("done", (d, exc)))
    reads.read(facts(3), lambda s, exc: answers.setdefault("read", (s, exc)))
    spin(hub, lambda: len(answers) == 3)
    assert store.round_trips - before == 1
    claim, error = answers["new"]
    assert error is None and claim.outcome is Claim.ACQUIRED and claim.attempt == 1
    assert answers["done"][0].outcome is Claim.ALREADY_DONE
    assert answers["read"] == (None, None)
    completed: list[Any] = []
    reads.complete(facts(1), claim.token, lambda fence, exc: completed.append((fence, exc)))
    spin(hub, lambda: completed)
    assert completed[0][0].ok and completed[0][1] is None
    assert store.peek("celery", "m-1").status is Status.COMPLETED
    reads.close()


def test_a_flushed_script_is_loaded_again_and_the_call_still_answers(redis_url, hub):
    store = RedisStore.from_url(redis_url)
    reads = pipelined_reads_for(store, hub, 2.0)
    assert reads is not None
    first_answer(reads, hub)
    store.client.script_flush()
    answers: list[Any] = []
    reads.claim(facts(7), Limits(60_000), "gate-1", lambda d, exc: answers.append((d, exc)))
    spin(hub, lambda: answers)
    assert answers[0][1] is None and answers[0][0].outcome is Claim.ACQUIRED
    assert store.peek("celery", "m-7").attempts == 1, "claimed once, not once per try"
    reads.close()


def test_an_error_reply_goes_to_its_own_call_and_the_others_are_answered(redis_url, hub):
    store = RedisStore.from_url(redis_url)
    reads = pipelined_reads_for(store, hub, 2.0)
    assert reads is not None
    store.client.set(store.key("celery", "m-8"), "not a hash")  # WRONGTYPE inside the script
    answers: dict[int, Any] = {}
    for n in (8, 9):
        reads.claim(facts(n), Limits(60_000), "g", lambda d, e, n=n: answers.setdefault(n, (d, e)))
    spin(hub, lambda: len(answers) == 2)
    assert answers[8][0] is None and "WRONGTYPE" in str(answers[8][1])
    assert answers[9][1] is None and answers[9][0].outcome is Claim.ACQUIRED
    reads.close()
