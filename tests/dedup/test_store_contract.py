"""One contract for every dedup store: the in-memory fake (the pure rules of
``celery_beetle.store.outcome``) and Redis (the Lua scripts) must behave the same.

Each scenario runs once per store through the parametrized ``store`` fixture; the tests
marked Redis-only check what only a real server has (memory, TTLs on every key, atomicity).
``test_fake_and_redis_agree_on_random_histories`` drives both with the same random
operations and compares every answer and every record.
"""

from __future__ import annotations

import itertools
import random
import threading
import uuid

import pytest
import redis

from celery_beetle.store import RedisStore, Store
from celery_beetle.store.fake import FakeStore
from celery_beetle.store.outcome import (
    DEAD_LETTER_LEASE_MS,
    Claim,
    Failure,
    Fence,
    Gate,
    GiveUpReason,
    Limits,
    Rejected,
)
from celery_beetle.store.state import MessageFacts, State, Status
from tests.dedup.conftest import ManualClock

DAY_MS = 86_400_000
LEASE_MS = 60_000
LIMITS = Limits(
    lease_timeout_ms=LEASE_MS, attempts=3, exceptions=2, delay_ms=1_000, max_delay_ms=3_000
)


def message(clock: ManualClock, message_id: str = "m-1", queue: str = "celery") -> MessageFacts:
    return MessageFacts(queue, message_id, expires_at_ms=clock() + DAY_MS)


def redis_only(store: Store) -> RedisStore:
    if not isinstance(store, RedisStore):
        pytest.skip("only a real Redis has this property")
    return store


# Claim and lease


def test_first_claim_acquires_the_lease(store, clock):
    msg = message(clock)
    claim = store.claim(msg, LIMITS, "w1")
    assert (claim.outcome, claim.token, claim.attempt) == (Claim.ACQUIRED, 1, 1)
    assert claim.lease_deadline_ms == clock() + LEASE_MS
    assert store.peek(msg.queue, msg.message_id) == State(
        Status.RUNNING,
        attempts=1,
        lease_deadline_ms=clock() + LEASE_MS,
        owner="w1",
        token=1,
        expires_at_ms=msg.expires_at_ms,
    )


def test_second_claim_while_leased_is_locked(store, clock):
    msg = message(clock)
    store.claim(msg, LIMITS, "w1")
    clock.advance(10_000)
    claim = store.claim(msg, LIMITS, "w2")
    assert (claim.outcome, claim.owner, claim.delay_ms) == (Claim.LOCKED, "w1", 50_000)
    assert store.gate(msg).outcome is Gate.DEFER


def test_claim_after_the_lease_expired_is_acquired_with_a_new_token_and_the_next_attempt(
    store, clock
):
    msg = message(clock)
    store.claim(msg, LIMITS, "w1")
    clock.advance(LEASE_MS)
    assert store.gate(msg).outcome is Gate.RUN
    claim = store.claim(msg, LIMITS, "w2")
    assert (claim.outcome, claim.token, claim.attempt) == (Claim.ACQUIRED, 2, 2)
    assert claim.taken_over, "a lease that ran out was taken over (the metrics count it)"


def test_only_a_claim_over_a_lease_that_ran_out_is_a_takeover(store, clock):
    msg = message(clock)
    first = store.claim(msg, LIMITS, "w1")
    assert not first.taken_over
    assert not store.claim(msg, LIMITS, "w1").taken_over  # its own, asked again
    limits = Limits(LEASE_MS, attempts=3, exceptions=2, delay_ms=1_000, max_delay_ms=1_000)
    failure = store.fail(msg, first.token, limits, retryable=True)
    clock.advance(failure.delay_ms)
    retry = store.claim(msg, limits, "w2")
    assert (retry.outcome, retry.taken_over) == (Claim.ACQUIRED, False)  # a retry: no lease


def test_claim_after_the_last_attempt_crashed_fails_the_message_once_dead_lettered(store, clock):
    msg = message(clock)
    limits = Limits(lease_timeout_ms=LEASE_MS, attempts=1)
    store.claim(msg, limits, "w1")
    clock.advance(LEASE_MS)
    claim = store.claim(msg, limits, "w2")
    assert (claim.outcome, claim.attempt, claim.reason) == (Claim.DEAD_LETTER, 1, "attempts_limit")
    assert store.gate(msg).outcome is Gate.DEFER, "w2 is publishing the dead letter"
    assert store.claim(msg, limits, "w3").outcome is Claim.LOCKED
    assert store.dead_lettered(msg) is True
    assert store.dead_lettered(msg) is False
    assert store.gate(msg).outcome is Gate.DROP_DUPLICATE
    assert store.claim(msg, limits, "w3").status is Status.FAILED


def test_an_owed_dead_letter_is_handed_to_another_copy_after_its_lease(store, clock):
    msg = message(clock)
    limits = Limits(lease_timeout_ms=LEASE_MS, attempts=1)
    token = store.claim(msg, limits, "w1").token
    assert store.fail(msg, token, limits, False, "w1").outcome is Failure.GIVE_UP
    clock.advance(DEAD_LETTER_LEASE_MS)  # w1 died before publishing it
    assert store.gate(msg).outcome is Gate.RUN
    claim = store.claim(msg, limits, "w2")
    assert (claim.outcome, claim.reason) == (Claim.DEAD_LETTER, "not_retryable")


def test_a_claim_retried_after_a_lost_reply_is_recognised_as_its_own(store, clock):
    msg = message(clock)
    limits = Limits(lease_timeout_ms=LEASE_MS, attempts=1)
    first = store.claim(msg, limits, "run-a")
    clock.advance(1_000)
    again = store.claim(msg, limits, "run-a")
    assert (again.outcome, again.token, again.attempt) == (Claim.ACQUIRED, first.token, 1)
    assert store.claim(msg, limits, "run-b").outcome is Claim.LOCKED


def test_a_failure_retried_after_a_lost_reply_gets_the_same_answer(store, clock):
    msg = message(clock)
    token = store.claim(msg, LIMITS, "w1").token
    first = store.fail(msg, token, LIMITS, True, "w1")
    clock.advance(100)
    again = store.fail(msg, token, LIMITS, True, "w1")
    assert again.outcome is Failure.RETRY
    assert again.retry_not_before_ms == first.retry_not_before_ms


def test_a_claim_whose_reply_never_came_is_released_by_its_owner(store, clock):
    msg = message(clock)
    store.claim(msg, LIMITS, "run-a")
    assert store.release(msg, 0, "run-b").outcome is Fence.NOT_OWNER
    assert store.release(msg, 0, "run-a").outcome is Fence.OK
    assert store.claim(msg, LIMITS, "run-c").attempt == 1


# Reservations: the gate's claim counts no attempt until the body begins


RESERVE_MS = 10_000


def test_a_reservation_counts_no_attempt_until_the_pool_starts_the_body(store, clock):
    msg = message(clock)
    claim = store.claim(msg, LIMITS, "gate", RESERVE_MS)
    assert (claim.outcome, claim.token, claim.attempt) == (Claim.ACQUIRED, 1, 1)
    assert claim.lease_deadline_ms == clock() + RESERVE_MS
    reserved = store.peek(msg.queue, msg.message_id)
    assert (reserved.attempts, reserved.reserved) == (0, True)
    clock.advance(2_000)
    started = store.start(msg, claim.token, LIMITS)
    assert (started.outcome, started.attempt) == (Fence.OK, 1)
    assert started.lease_deadline_ms == clock() + LEASE_MS
    record = store.peek(msg.queue, msg.message_id)
    assert (record.attempts, record.reserved, record.lease_deadline_ms) == (
        1,
        False,
        clock() + LEASE_MS,
    )
    assert store.start(msg, claim.token, LIMITS) == started  # a retry after a lost reply


def test_a_reservation_that_ran_out_is_taken_over_without_using_an_attempt(store, clock):
    msg = message(clock)
    once = Limits(lease_timeout_ms=LEASE_MS, attempts=1)
    first = store.claim(msg, once, "gate-a", RESERVE_MS)  # its worker is killed: never starts
    clock.advance(RESERVE_MS + 1)
    second = store.claim(msg, once, "gate-b", RESERVE_MS)
    assert (second.outcome, second.attempt, second.taken_over) == (Claim.ACQUIRED, 1, False)
    assert store.start(msg, first.token, once).outcome is Fence.NOT_OWNER  # too late
    assert store.start(msg, second.token, once).attempt == 1
    assert store.complete(msg, second.token).ok


def test_a_body_that_began_and_was_cut_short_uses_its_attempt(store, clock):
    msg = message(clock)
    once = Limits(lease_timeout_ms=LEASE_MS, attempts=1)
    claim = store.claim(msg, once, "gate-a", RESERVE_MS)
    store.start(msg, claim.token, once)
    clock.advance(LEASE_MS + 1)
    taken = store.claim(msg, once, "gate-b", RESERVE_MS)
    assert (taken.outcome, taken.reason) == (Claim.DEAD_LETTER, "attempts_limit")


def test_a_renewed_reservation_is_not_taken_over_and_a_renewal_never_shortens_a_lease(store, clock):
    msg = message(clock)
    claim = store.claim(msg, LIMITS, "gate", RESERVE_MS)
    clock.advance(RESERVE_MS - 1_000)
    renewed = store.extend(msg, claim.token, RESERVE_MS, reservation=True)
    assert renewed.lease_deadline_ms == clock() + RESERVE_MS
    clock.advance(2_000)
    assert store.claim(msg, LIMITS, "other", RESERVE_MS).outcome is Claim.LOCKED
    started = store.start(msg, claim.token, LIMITS)
    again = store.extend(msg, claim.token, RESERVE_MS, reservation=True)
    assert (again.outcome, again.lease_deadline_ms) == (Fence.OK, started.lease_deadline_ms)
    assert store.peek(msg.queue, msg.message_id).lease_deadline_ms == started.lease_deadline_ms


def test_releasing_a_reservation_leaves_the_attempts_as_they_were(store, clock):
    msg = message(clock)
    claim = store.claim(msg, LIMITS, "gate", RESERVE_MS)
    assert store.release(msg, claim.token).ok
    assert store.peek(msg.queue, msg.message_id).attempts == 0
    by_owner = store.claim(msg, LIMITS, "gate-2", RESERVE_MS)
    assert store.release(msg, 0, "gate-2").ok  # a claim whose reply never came
    assert by_owner.acquired and store.peek(msg.queue, msg.message_id).attempts == 0


def test_a_crashed_run_that_marked_the_inbox_may_start_again_past_its_attempts(store, clock):
    msg = message(clock)
    once = Limits(lease_timeout_ms=LEASE_MS, attempts=1)
    claim = store.claim(msg, once, "gate-a", RESERVE_MS)
    store.start(msg, claim.token, once)
    assert store.mark_inbox(msg, claim.token).ok
    clock.advance(LEASE_MS + 1)  # killed right after its commit
    second = store.claim(msg, once, "gate-b", RESERVE_MS)
    assert (second.outcome, second.attempt) == (Claim.ACQUIRED, 2)
    assert store.start(msg, second.token, once).attempt == 2
    clock.advance(LEASE_MS + 1)
    third = store.claim(msg, once, "gate-c", RESERVE_MS)
    assert third.acquired and store.start(msg, third.token, once).attempt == 3
    clock.advance(LEASE_MS + 1)  # a body that kills its worker every time still gives up
    assert store.claim(msg, once, "gate-d", RESERVE_MS).outcome is Claim.DEAD_LETTER


def test_an_inbox_mark_gives_no_extra_attempt_to_a_body_that_raised(store, clock):
    msg = message(clock)
    once = Limits(lease_timeout_ms=LEASE_MS, attempts=1)
    claim = store.claim(msg, once, "w")
    store.mark_inbox(msg, claim.token)
    failure = store.fail(msg, claim.token, once, retryable=True, owner="w")
    assert (failure.outcome, failure.reason) == (Failure.GIVE_UP, GiveUpReason.ATTEMPTS_LIMIT)


def test_first_seen_is_kept_across_calls(store, clock):
    msg = message(clock)
    first = store.first_seen(msg, 60_000)
    clock.advance(5_000)
    assert store.first_seen(msg, 60_000) == first
    assert store.peek(msg.queue, msg.message_id) is None, "the mark is no record"


def test_an_expired_message_is_dropped_by_the_gate_without_a_read_and_never_claimed(store, clock):
    msg = MessageFacts("celery", "m-old", expires_at_ms=clock())
    before = store.round_trips
    assert store.gate(msg).outcome is Gate.DROP_EXPIRED
    assert store.round_trips == before
    assert store.claim(msg, LIMITS, "w1").outcome is Claim.EXPIRED
    assert store.peek(msg.queue, msg.message_id) is None


# Completion and fencing


def test_owner_completes_and_every_later_copy_is_a_duplicate(store, clock):
    msg = message(clock)
    token = store.claim(msg, LIMITS, "w1").token
    assert store.complete(msg, token).outcome is Fence.OK
    gate = store.gate(msg)
    assert (gate.outcome, gate.status) == (Gate.DROP_DUPLICATE, Status.COMPLETED)
    claim = store.claim(msg, LIMITS, "w2")
    assert (claim.outcome, claim.status) == (Claim.ALREADY_DONE, Status.COMPLETED)
    assert store.peek(msg.queue, msg.message_id) == State(
        Status.COMPLETED, attempts=1, token=1, expires_at_ms=msg.expires_at_ms
    )


def test_complete_by_a_stale_token_is_refused(store, clock):
    msg = message(clock)
    stale = store.claim(msg, LIMITS, "w1").token
    clock.advance(LEASE_MS)
    current = store.claim(msg, LIMITS, "w2").token
    refused = store.complete(msg, stale)
    assert (refused.outcome, refused.status, refused.token) == (
        Fence.NOT_OWNER,
        Status.RUNNING,
        current,
    )
    assert store.fail(msg, stale, LIMITS, retryable=True).outcome is Failure.NOT_OWNER
    assert store.extend(msg, stale, LEASE_MS).outcome is Fence.NOT_OWNER
    assert store.release(msg, stale).outcome is Fence.NOT_OWNER
    assert store.complete(msg, current).outcome is Fence.OK


def test_a_completion_retried_after_a_lost_reply_is_accepted_once_more(store, clock):
    msg = message(clock)
    token = store.claim(msg, LIMITS, "w1").token
    assert store.complete(msg, token).outcome is Fence.OK
    assert store.complete(msg, token).outcome is Fence.OK
    assert store.complete(msg, token + 1).outcome is Fence.NOT_OWNER


def test_completing_an_unknown_message_is_refused(store, clock):
    refused = store.complete(message(clock), 1)
    assert (refused.outcome, refused.status, refused.token) == (Fence.NOT_OWNER, None, 0)


# Failure, retry and giving up


def test_failures_within_limits_back_off_exponentially_up_to_max_delay(store, clock):
    msg = message(clock)
    limits = Limits(LEASE_MS, attempts=5, exceptions=4, delay_ms=1_000, max_delay_ms=3_000)
    delays = []
    for attempt in range(1, 5):
        claim = store.claim(msg, limits, "w1")
        assert (claim.outcome, claim.attempt) == (Claim.ACQUIRED, attempt)
        failure = store.fail(msg, claim.token, limits, retryable=True)
        assert failure.outcome is Failure.RETRY
        assert failure.retry_not_before_ms == clock() + failure.delay_ms
        delays.append(failure.delay_ms)
        clock.advance(failure.delay_ms - 1)
        delayed = store.claim(msg, limits, "w1")
        assert (delayed.outcome, delayed.delay_ms) == (Claim.DELAYED, 1)
        assert store.gate(msg).outcome is Gate.DEFER
        clock.advance(1)
    assert delays == [1_000, 2_000, 3_000, 3_000]


def test_failure_past_the_attempts_limit_gives_up_and_the_message_is_failed(store, clock):
    msg = message(clock)
    for _ in range(LIMITS.attempts - 1):
        claim = store.claim(msg, LIMITS, "w1")
        failure = store.fail(msg, claim.token, LIMITS, retryable=True)
        assert failure.outcome is Failure.RETRY
        clock.advance(failure.delay_ms)
    last = store.claim(msg, LIMITS, "w1")
    failure = store.fail(msg, last.token, LIMITS, retryable=True)
    assert (failure.outcome, failure.reason) == (Failure.GIVE_UP, GiveUpReason.ATTEMPTS_LIMIT)
    assert (failure.attempts, failure.exceptions) == (3, 3)
    assert store.gate(msg).outcome is Gate.DEFER, "until its dead letter is stored"
    assert store.dead_lettered(msg) is True
    gate = store.gate(msg)
    assert (gate.outcome, gate.status) == (Gate.DROP_DUPLICATE, Status.FAILED)
    assert store.claim(msg, LIMITS, "w2").outcome is Claim.ALREADY_DONE


def test_one_exception_past_the_exceptions_limit_gives_up(store, clock):
    msg = message(clock)
    limits = Limits(LEASE_MS, attempts=5, exceptions=0, delay_ms=0, max_delay_ms=0)
    claim = store.claim(msg, limits, "w1")
    failure = store.fail(msg, claim.token, limits, retryable=True)
    assert (failure.outcome, failure.reason) == (Failure.GIVE_UP, GiveUpReason.EXCEPTIONS_LIMIT)


def test_an_exception_not_in_retry_on_gives_up_at_once(store, clock):
    msg = message(clock)
    claim = store.claim(msg, LIMITS, "w1")
    failure = store.fail(msg, claim.token, LIMITS, retryable=False)
    assert (failure.outcome, failure.reason) == (Failure.GIVE_UP, GiveUpReason.NOT_RETRYABLE)
    assert store.peek(msg.queue, msg.message_id).status is Status.FAILED


def test_a_retry_without_delay_can_be_claimed_at_once(store, clock):
    msg = message(clock)
    limits = Limits(LEASE_MS, attempts=2, exceptions=1, delay_ms=0, max_delay_ms=0)
    failure = store.fail(msg, store.claim(msg, limits, "w1").token, limits, retryable=True)
    assert (failure.outcome, failure.delay_ms) == (Failure.RETRY, 0)
    assert store.claim(msg, limits, "w2").attempt == 2


# Extension, release, forget


def test_owner_extends_its_lease_so_nobody_takes_over(store, clock):
    msg = message(clock)
    token = store.claim(msg, LIMITS, "w1").token
    clock.advance(50_000)
    extended = store.extend(msg, token, LEASE_MS)
    assert (extended.outcome, extended.lease_deadline_ms) == (Fence.OK, clock() + LEASE_MS)
    clock.advance(30_000)
    assert store.claim(msg, LIMITS, "w2").outcome is Claim.LOCKED


def test_release_hands_the_message_back_without_counting_the_attempt(store, clock):
    msg = message(clock)
    token = store.claim(msg, LIMITS, "w1").token
    assert store.release(msg, token).outcome is Fence.OK
    assert store.gate(msg).outcome is Gate.RUN
    claim = store.claim(msg, LIMITS, "w2")
    assert (claim.token, claim.attempt) == (2, 1)


def test_bad_input_is_rejected_once_and_its_other_copies_are_duplicates(store, clock):
    msg = message(clock)
    assert store.reject(msg, "undecodable", "g1").outcome is Rejected.FIRST
    waiting = store.reject(msg, "undecodable", "g2")
    assert (waiting.outcome, waiting.delay_ms) == (Rejected.WAIT, DEAD_LETTER_LEASE_MS)
    assert store.dead_lettered(msg) is True
    assert store.reject(msg, "undecodable", "g2").outcome is Rejected.DONE
    decision = store.gate(msg)
    assert (decision.outcome, decision.status) == (Gate.DROP_DUPLICATE, Status.FAILED)
    assert store.claim(msg, LIMITS, "w1").outcome is Claim.ALREADY_DONE


def test_a_completed_message_is_never_rejected(store, clock):
    msg = message(clock)
    store.complete(msg, store.claim(msg, LIMITS, "w1").token)
    assert store.reject(msg, "unknown_task", "g1").outcome is Rejected.DONE
    assert store.peek(msg.queue, msg.message_id).status is Status.COMPLETED


def test_forget_deletes_the_record(store, clock):
    msg = message(clock)
    store.claim(msg, LIMITS, "w1")
    assert store.forget(msg.queue, msg.message_id) is True
    assert store.peek(msg.queue, msg.message_id) is None
    assert store.forget(msg.queue, msg.message_id) is False


def test_the_same_message_id_on_two_queues_is_two_records(store, clock):
    store.claim(message(clock, queue="a"), LIMITS, "w1")
    assert store.claim(message(clock, queue="b"), LIMITS, "w1").outcome is Claim.ACQUIRED


def test_a_long_owner_is_cut_to_keep_the_record_small(store, clock):
    msg = message(clock)
    store.claim(msg, LIMITS, "x" * 100)
    assert store.peek(msg.queue, msg.message_id).owner == "x" * 48


# Key lifetime and cost


def test_every_write_leaves_the_record_with_a_ttl_past_the_message_expiry(store, clock):
    msg = message(clock)
    margin = store.ttl_margin_ms
    limits = Limits(LEASE_MS, attempts=2, exceptions=1, delay_ms=1_000, max_delay_ms=1_000)

    def ttl() -> int:
        value = store.ttl_ms(msg.queue, msg.message_id)
        assert value is not None and value > 0
        return value

    claim = store.claim(msg, limits, "w1")
    assert msg.expires_at_ms - clock() < ttl() <= msg.expires_at_ms - clock() + margin
    store.fail(msg, claim.token, limits, retryable=True)
    assert ttl() <= msg.expires_at_ms - clock() + margin
    clock.advance(1_000)
    claim = store.claim(msg, limits, "w1")
    store.complete(msg, claim.token)
    assert ttl() <= msg.expires_at_ms - clock() + margin


def test_a_lease_longer_than_the_message_life_keeps_the_record_until_the_lease_ends(store, clock):
    msg = MessageFacts("celery", "m-short", expires_at_ms=clock() + 1_000)
    store.claim(msg, Limits(lease_timeout_ms=DAY_MS), "w1")
    assert store.ttl_ms(msg.queue, msg.message_id) > DAY_MS


def test_a_redundant_pair_costs_four_round_trips_and_a_duplicate_one(store, clock):
    msg = message(clock)
    start = store.round_trips
    assert store.gate(msg).outcome is Gate.RUN
    token = store.claim(msg, LIMITS, "w1").token
    store.complete(msg, token)
    assert store.gate(msg).outcome is Gate.DROP_DUPLICATE
    assert store.round_trips - start == 4
    assert store.gate(msg).outcome is Gate.DROP_DUPLICATE
    assert store.round_trips - start == 5


def test_keys_are_hash_tagged_per_message(store):
    assert store.key("celery", "m-1") == "beetle:{celery:m-1}"


# Redis only


def test_memory_per_in_flight_message_is_at_most_300_bytes(store, clock):
    redis_store = redis_only(store)
    sizes = []
    for _ in range(50):
        msg = MessageFacts("celery", str(uuid.uuid4()), expires_at_ms=clock() + DAY_MS)
        redis_store.claim(msg, LIMITS, "celery@worker-07.example.com:123456")
        key = redis_store.key(msg.queue, msg.message_id)
        assert redis_store.client.object("encoding", key) == "listpack"
        sizes.append(redis_store.client.memory_usage(key, samples=0))
    assert sum(sizes) / len(sizes) <= 300


def test_no_key_is_ever_left_without_a_ttl(store, clock):
    redis_store = redis_only(store)
    msg = message(clock)
    limits = Limits(LEASE_MS, attempts=2, exceptions=1)
    claim = redis_store.claim(msg, limits, "w1")
    redis_store.fail(msg, claim.token, limits, retryable=True)
    clock.advance(limits.delay_ms)
    redis_store.complete(msg, redis_store.claim(msg, limits, "w1").token)
    redis_store.claim(message(clock, "m-2"), limits, "w1")
    client = redis_store.client
    keys = list(client.scan_iter("beetle:*"))
    assert len(keys) == 2
    assert all(client.pttl(key) > 0 for key in keys)


def test_only_one_of_many_simultaneous_claims_acquires(store, clock):
    redis_store = redis_only(store)
    msg = message(clock)
    outcomes: list[Claim] = []
    barrier = threading.Barrier(16)

    def claim(n: int) -> None:
        barrier.wait()
        outcomes.append(redis_store.claim(msg, LIMITS, f"w{n}").outcome)

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(o.value for o in outcomes) == ["acquired"] + ["locked"] * 15


def test_scripts_are_loaded_again_after_redis_forgot_them(store, clock):
    redis_store = redis_only(store)
    redis_store.client.script_flush()
    assert redis_store.claim(message(clock), LIMITS, "w1").outcome is Claim.ACQUIRED


def test_a_bytes_client_works_too(redis_url, clock):
    raw = RedisStore(redis.Redis.from_url(redis_url), clock=clock)
    msg = message(clock)
    token = raw.claim(msg, LIMITS, "w1").token
    state = raw.peek(msg.queue, msg.message_id)
    assert state is not None and state.owner == "w1"
    assert raw.complete(msg, token).outcome is Fence.OK
    raw.close()


def test_fake_and_redis_agree_on_random_histories(redis_url):
    """Random operations, the same on both stores: every answer and record must match.

    Four slots each hold one message at a time; a message that is finished or expired is
    replaced by a new one, so the history keeps visiting every outcome.
    """
    rng = random.Random(20261123)
    clock = ManualClock(1_800_000_000_000)
    fake = FakeStore(clock=clock)
    real = RedisStore.from_url(redis_url, clock=clock)
    seen: set[tuple[str, str]] = set()

    def fresh(n: int) -> tuple[MessageFacts, int]:
        life = rng.choice([3_000, 20_000, DAY_MS])
        return MessageFacts("q", f"m-{n}", expires_at_ms=clock() + life), 0

    serial = itertools.count()
    slots = [fresh(next(serial)) for _ in range(4)]
    try:
        for step in range(3_000):
            index = rng.randrange(len(slots))
            msg, token = slots[index]
            state = fake.peek(msg.queue, msg.message_id)
            done = msg.expires_at_ms <= clock() or (state and state.settled)
            if done and rng.random() < 0.5:
                slots[index] = fresh(next(serial))
                msg, token = slots[index]
            limits = Limits(
                lease_timeout_ms=rng.choice([1_000, 5_000]),
                attempts=rng.randint(1, 4),
                exceptions=rng.randint(0, 3),
                delay_ms=rng.choice([0, 500, 2_000]),
                max_delay_ms=rng.choice([1_000, 5_000]),
            )
            use = token if rng.random() < 0.8 else token - 1
            operation = rng.choice(
                ["gate", "claim", "claim", "reserve", "start", "renew", "mark_inbox",
                 "complete", "fail", "extend", "release", "reject", "dead_lettered"]
            )  # fmt: skip
            owner = rng.choice(["w", "v"])
            answers: tuple[object, object]
            if operation == "gate":
                answers = fake.gate(msg), real.gate(msg)
            elif operation == "claim":
                answers = fake.claim(msg, limits, owner), real.claim(msg, limits, owner)
                if answers[0].acquired:
                    slots[index] = msg, answers[0].token
            elif operation == "reserve":
                reserve = rng.choice([500, 1_500])
                answers = (
                    fake.claim(msg, limits, owner, reserve),
                    real.claim(msg, limits, owner, reserve),
                )
                if answers[0].acquired:
                    slots[index] = msg, answers[0].token
            elif operation == "start":
                answers = fake.start(msg, use, limits), real.start(msg, use, limits)
            elif operation == "renew":
                answers = (
                    fake.extend(msg, use, 1_000, reservation=True),
                    real.extend(msg, use, 1_000, reservation=True),
                )
            elif operation == "mark_inbox":
                answers = fake.mark_inbox(msg, use), real.mark_inbox(msg, use)
            elif operation == "complete":
                answers = fake.complete(msg, use), real.complete(msg, use)
            elif operation == "fail":
                retryable = rng.random() < 0.8
                answers = (
                    fake.fail(msg, use, limits, retryable, owner),
                    real.fail(msg, use, limits, retryable, owner),
                )
            elif operation == "extend":
                answers = fake.extend(msg, use, 2_000), real.extend(msg, use, 2_000)
            elif operation == "reject":
                answers = fake.reject(msg, "bad", owner), real.reject(msg, "bad", owner)
            elif operation == "dead_lettered":
                answers = fake.dead_lettered(msg), real.dead_lettered(msg)
            else:
                by = rng.choice([use, 0])
                answers = fake.release(msg, by, owner), real.release(msg, by, owner)
            assert answers[0] == answers[1], (step, operation, msg)
            assert fake.peek("q", msg.message_id) == real.peek("q", msg.message_id), (step, msg)
            seen.add((operation, str(getattr(answers[0], "outcome", answers[0]))))
            clock.advance(rng.choice([0, 0, 50, 200, 700, 2_000]))
    finally:
        real.close()
    # The history is only worth something if it went through the interesting outcomes.
    for expected in [
        ("claim", "Claim.ACQUIRED"),
        ("claim", "Claim.LOCKED"),
        ("claim", "Claim.DELAYED"),
        ("claim", "Claim.DEAD_LETTER"),
        ("reject", "Rejected.WAIT"),
        ("reject", "Rejected.FIRST"),
        ("claim", "Claim.ALREADY_DONE"),
        ("complete", "Fence.OK"),
        ("fail", "Failure.RETRY"),
        ("fail", "Failure.GIVE_UP"),
        ("extend", "Fence.OK"),
        ("release", "Fence.OK"),
        ("gate", "Gate.DEFER"),
        ("reserve", "Claim.ACQUIRED"),
        ("start", "Fence.OK"),
        ("start", "Fence.NOT_OWNER"),
        ("renew", "Fence.OK"),
        ("mark_inbox", "Fence.OK"),
    ]:
        assert expected in seen, expected
