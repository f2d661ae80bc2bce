"""The dedup rules as pure functions: no Redis, no clock, every outcome named."""

from __future__ import annotations

from dataclasses import replace

import pytest

from celery_beetle.store.outcome import (
    DEAD_LETTER_LEASE_MS,
    Claim,
    Failure,
    Fence,
    FenceDecision,
    Gate,
    GiveUpReason,
    Limits,
    Rejected,
    decide_claim,
    decide_complete,
    decide_dead_lettered,
    decide_extend,
    decide_failure,
    decide_gate,
    decide_reject,
    decide_release,
    key_ttl_ms,
)
from celery_beetle.store.state import MessageFacts, State, Status

NOW = 1_700_000_000_000
DAY = 86_400_000
FACTS = MessageFacts("celery", "m-1", expires_at_ms=NOW + DAY)
LIMITS = Limits(
    lease_timeout_ms=60_000, attempts=3, exceptions=2, delay_ms=1_000, max_delay_ms=3_000
)


def running(**changes: int | str) -> State:
    state = State(
        Status.RUNNING,
        attempts=1,
        lease_deadline_ms=NOW + 60_000,
        owner="w1",
        token=1,
        expires_at_ms=NOW + DAY,
    )
    return replace(state, **changes)  # type: ignore[arg-type]


# The gate


def test_gate_runs_a_message_redis_has_never_seen():
    assert decide_gate(None, FACTS, NOW).outcome is Gate.RUN


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED])
def test_gate_drops_a_copy_of_a_finished_message_as_duplicate(status):
    decision = decide_gate(State(status, expires_at_ms=NOW + DAY), FACTS, NOW)
    assert decision.outcome is Gate.DROP_DUPLICATE
    assert decision.status is status


def test_gate_defers_a_copy_while_its_twin_runs_under_a_live_lease():
    decision = decide_gate(running(), FACTS, NOW + 10_000)
    assert decision.outcome is Gate.DEFER
    assert decision.delay_ms == 50_000


def test_gate_defers_a_message_until_its_retry_is_due():
    delayed = State(Status.PENDING, retry_not_before_ms=NOW + 4_000, expires_at_ms=NOW + DAY)
    decision = decide_gate(delayed, FACTS, NOW)
    assert (decision.outcome, decision.delay_ms) == (Gate.DEFER, 4_000)


def test_gate_runs_a_message_whose_retry_is_due():
    due = State(Status.PENDING, retry_not_before_ms=NOW, expires_at_ms=NOW + DAY)
    assert decide_gate(due, FACTS, NOW).outcome is Gate.RUN


def test_gate_runs_a_message_whose_worker_died_and_lease_ran_out():
    assert decide_gate(running(), FACTS, NOW + 60_000).outcome is Gate.RUN


def test_gate_drops_an_expired_message_whatever_redis_holds():
    expired = replace(FACTS, expires_at_ms=NOW)
    assert decide_gate(None, expired, NOW).outcome is Gate.DROP_EXPIRED
    assert decide_gate(running(), expired, NOW).outcome is Gate.DROP_EXPIRED


# The claim


def test_first_claim_acquires_the_lease_with_token_one_and_attempt_one():
    decision, state = decide_claim(None, FACTS, LIMITS, "w1", NOW)
    assert decision.acquired
    assert (decision.token, decision.attempt) == (1, 1)
    assert decision.lease_deadline_ms == NOW + 60_000
    assert state == running()


def test_claim_is_locked_while_another_owner_holds_a_live_lease():
    decision, state = decide_claim(running(), FACTS, LIMITS, "w2", NOW + 1_000)
    assert decision.outcome is Claim.LOCKED
    assert (decision.owner, decision.delay_ms) == ("w1", 59_000)
    assert state is None


def test_claim_after_the_lease_ran_out_takes_over_with_a_new_token_and_the_next_attempt():
    decision, state = decide_claim(running(), FACTS, LIMITS, "w2", NOW + 60_000)
    assert decision.acquired
    assert (decision.token, decision.attempt) == (2, 2)
    assert state is not None and state.owner == "w2"


def test_claim_of_a_finished_message_says_already_done():
    for status in (Status.COMPLETED, Status.FAILED):
        decision, state = decide_claim(State(status), FACTS, LIMITS, "w2", NOW)
        assert (decision.outcome, decision.status, state) == (Claim.ALREADY_DONE, status, None)


def test_claim_before_retry_not_before_is_delayed():
    delayed = State(Status.PENDING, attempts=1, exceptions=1, retry_not_before_ms=NOW + 500)
    decision, state = decide_claim(delayed, FACTS, LIMITS, "w1", NOW)
    assert (decision.outcome, decision.delay_ms, state) == (Claim.DELAYED, 500, None)


def test_claim_after_the_last_attempt_crashed_fails_the_message_and_owes_its_dead_letter():
    crashed = running(attempts=3, token=3)
    decision, state = decide_claim(crashed, FACTS, LIMITS, "w2", NOW + 60_000)
    assert (decision.outcome, decision.attempt) == (Claim.DEAD_LETTER, 3)
    assert decision.reason == GiveUpReason.ATTEMPTS_LIMIT.value
    assert state is not None and state.status is Status.FAILED and not state.settled
    assert state.dead_letter_owed and state.reason == "attempts_limit"
    assert (state.owner, state.lease_deadline_ms) == ("w2", NOW + 60_000 + DEAD_LETTER_LEASE_MS)


def test_a_claim_retried_by_its_owner_after_a_lost_reply_gets_the_same_token_and_attempt():
    _, state = decide_claim(None, FACTS, LIMITS, "w1", NOW)
    assert state is not None
    again, state2 = decide_claim(state, FACTS, LIMITS, "w1", NOW + 1_000)
    assert (again.outcome, again.token, again.attempt) == (Claim.ACQUIRED, 1, 1)
    assert again.lease_deadline_ms == NOW + 1_000 + 60_000
    assert state2 == replace(state, lease_deadline_ms=NOW + 61_000)


def test_a_lost_reply_of_the_exhausting_claim_gets_the_dead_letter_again_not_a_duplicate():
    crashed = running(attempts=3, token=3)
    _, owed = decide_claim(crashed, FACTS, LIMITS, "w2", NOW + 60_000)
    again, _ = decide_claim(owed, FACTS, LIMITS, "w2", NOW + 60_001)
    assert (again.outcome, again.reason) == (Claim.DEAD_LETTER, "attempts_limit")


def test_an_owed_dead_letter_is_locked_for_others_until_its_lease_ends_then_handed_over():
    start = NOW + 60_000
    _, owed = decide_claim(running(attempts=3, token=3), FACTS, LIMITS, "w2", start)
    assert owed is not None
    assert decide_gate(owed, FACTS, start + 1).outcome is Gate.DEFER
    locked, _ = decide_claim(owed, FACTS, LIMITS, "w3", start + 1)
    assert (locked.outcome, locked.owner) == (Claim.LOCKED, "w2")
    later = start + DEAD_LETTER_LEASE_MS
    assert decide_gate(owed, FACTS, later).outcome is Gate.RUN
    taken, state = decide_claim(owed, FACTS, LIMITS, "w3", later)
    assert (taken.outcome, taken.reason) == (Claim.DEAD_LETTER, "attempts_limit")
    assert state is not None and state.owner == "w3"


def test_once_dead_lettered_the_failed_message_is_settled_and_every_copy_a_duplicate():
    _, owed = decide_claim(running(attempts=3, token=3), FACTS, LIMITS, "w2", NOW + 60_000)
    marked, state = decide_dead_lettered(owed)
    assert marked and state is not None and state.settled
    assert (state.owner, state.lease_deadline_ms, state.reason) == ("", 0, "attempts_limit")
    assert decide_dead_lettered(state) == (False, None)
    assert decide_gate(state, FACTS, NOW).outcome is Gate.DROP_DUPLICATE
    assert decide_claim(state, FACTS, LIMITS, "w3", NOW)[0].outcome is Claim.ALREADY_DONE


def test_claim_of_an_expired_message_writes_nothing():
    decision, state = decide_claim(None, replace(FACTS, expires_at_ms=NOW), LIMITS, "w1", NOW)
    assert (decision.outcome, state) == (Claim.EXPIRED, None)


# Completion and fencing


def test_owner_completes_and_the_record_keeps_no_lease():
    decision, state = decide_complete(running(), token=1)
    assert decision.ok
    assert state == State(Status.COMPLETED, attempts=1, token=1, expires_at_ms=NOW + DAY)


def test_a_late_worker_whose_lease_was_taken_over_cannot_complete():
    taken_over = running(token=2, owner="w2")
    decision, state = decide_complete(taken_over, token=1)
    assert (decision.outcome, decision.token, decision.status) == (
        Fence.NOT_OWNER,
        2,
        Status.RUNNING,
    )
    assert state is None


def test_completing_a_record_that_is_gone_is_refused():
    decision, state = decide_complete(None, token=1)
    assert (decision.outcome, decision.status, state) == (Fence.NOT_OWNER, None, None)


def test_completing_again_with_the_same_token_is_accepted_without_a_write():
    # A worker whose completion reply was lost retries it.
    _, completed = decide_complete(running(), token=1)
    assert decide_complete(completed, token=1) == (FenceDecision(Fence.OK), None)


def test_completing_a_message_completed_under_another_token_is_refused():
    _, completed = decide_complete(running(token=2), token=2)
    assert decide_complete(completed, token=1)[0].outcome is Fence.NOT_OWNER


def test_completing_a_failed_message_is_refused():
    _, failed = decide_failure(running(), 1, LIMITS, retryable=False, now_ms=NOW)
    assert decide_complete(failed, token=1)[0].outcome is Fence.NOT_OWNER


def test_owner_may_still_complete_after_its_lease_ran_out_if_nobody_took_over():
    # The token proves no other run started; the body ran exactly once.
    decision, _ = decide_complete(running(lease_deadline_ms=NOW - 1), token=1)
    assert decision.ok


# Failure, retry and backoff


def test_failure_within_limits_retries_after_the_base_delay():
    decision, state = decide_failure(running(), 1, LIMITS, retryable=True, now_ms=NOW)
    assert decision.outcome is Failure.RETRY
    assert (decision.delay_ms, decision.retry_not_before_ms) == (1_000, NOW + 1_000)
    assert (decision.attempts, decision.exceptions) == (1, 1)
    assert state == State(
        Status.PENDING,
        attempts=1,
        exceptions=1,
        retry_not_before_ms=NOW + 1_000,
        token=1,
        expires_at_ms=NOW + DAY,
    )


def test_retry_delay_doubles_per_failure_and_stops_at_max_delay():
    limits = replace(LIMITS, attempts=10, exceptions=9)
    delays = []
    for failures in range(5):
        state = running(attempts=failures + 1, exceptions=failures)
        decision, _ = decide_failure(state, 1, limits, retryable=True, now_ms=NOW)
        delays.append(decision.delay_ms)
    assert delays == [1_000, 2_000, 3_000, 3_000, 3_000]


def test_failure_of_the_last_attempt_gives_up_with_attempts_limit():
    decision, state = decide_failure(running(attempts=3, exceptions=1), 1, LIMITS, True, NOW)
    assert (decision.outcome, decision.reason) == (Failure.GIVE_UP, GiveUpReason.ATTEMPTS_LIMIT)
    assert state is not None and state.status is Status.FAILED and state.exceptions == 2


def test_one_exception_too_many_gives_up_with_exceptions_limit():
    limits = replace(LIMITS, attempts=5, exceptions=1)
    decision, _ = decide_failure(running(attempts=2, exceptions=1), 1, limits, True, NOW)
    assert (decision.outcome, decision.reason) == (Failure.GIVE_UP, GiveUpReason.EXCEPTIONS_LIMIT)


def test_exception_not_in_retry_on_gives_up_at_once():
    decision, state = decide_failure(running(), 1, LIMITS, retryable=False, now_ms=NOW)
    assert (decision.outcome, decision.reason) == (Failure.GIVE_UP, GiveUpReason.NOT_RETRYABLE)
    assert state is not None and state.status is Status.FAILED


def test_default_limits_give_up_at_the_first_exception():
    decision, _ = decide_failure(running(), 1, Limits(), retryable=True, now_ms=NOW)
    assert decision.reason is GiveUpReason.ATTEMPTS_LIMIT


def test_a_give_up_leaves_the_dead_letter_owed_by_the_failing_run():
    decision, state = decide_failure(running(), 1, LIMITS, False, NOW, owner="w1")
    assert decision.outcome is Failure.GIVE_UP
    assert state is not None and state.dead_letter_owed and state.reason == "not_retryable"
    assert (state.owner, state.lease_deadline_ms) == ("w1", NOW + DEAD_LETTER_LEASE_MS)


def test_a_failure_reported_again_after_a_lost_reply_gets_the_same_answer_and_writes_nothing():
    retry, pending = decide_failure(running(), 1, LIMITS, True, NOW, owner="w1")
    again, write = decide_failure(pending, 1, LIMITS, True, NOW + 100, owner="w1")
    assert write is None and again.outcome is Failure.RETRY
    assert again.retry_not_before_ms == retry.retry_not_before_ms and again.delay_ms == 900
    give_up, failed = decide_failure(running(), 1, LIMITS, False, NOW, owner="w1")
    again, write = decide_failure(failed, 1, LIMITS, False, NOW + 100, owner="w1")
    assert (again, write) == (give_up, None)


def test_a_claim_whose_reply_never_came_is_released_by_its_owner():
    fence, state = decide_release(running(), 0, "w1")
    assert fence.ok and state is not None and state.status is Status.PENDING
    assert state.attempts == 0
    assert not decide_release(running(), 0, "w2")[0].ok
    assert not decide_release(running(), 0, "")[0].ok


def test_a_stale_worker_cannot_report_a_failure():
    decision, state = decide_failure(running(token=2), 1, LIMITS, True, NOW)
    assert (decision.outcome, state) == (Failure.NOT_OWNER, None)


def test_a_retried_message_is_claimed_again_once_due_with_the_next_token():
    _, pending = decide_failure(running(), 1, LIMITS, retryable=True, now_ms=NOW)
    decision, state = decide_claim(pending, FACTS, LIMITS, "w2", NOW + 1_000)
    assert (decision.outcome, decision.token, decision.attempt) == (Claim.ACQUIRED, 2, 2)
    assert state is not None and state.exceptions == 1


# Lease extension and release


def test_owner_extends_its_lease_from_now():
    decision, state = decide_extend(running(), 1, 90_000, NOW + 30_000)
    assert decision.ok and decision.lease_deadline_ms == NOW + 120_000
    assert state == running(lease_deadline_ms=NOW + 120_000)


def test_a_stale_worker_cannot_extend():
    assert decide_extend(running(token=2), 1, 90_000, NOW)[0].outcome is Fence.NOT_OWNER


def test_release_hands_the_message_back_without_counting_the_attempt():
    decision, state = decide_release(running(), 1)
    assert decision.ok
    assert state == State(Status.PENDING, attempts=0, token=1, expires_at_ms=NOW + DAY)
    again, _ = decide_claim(state, FACTS, LIMITS, "w2", NOW)
    assert (again.token, again.attempt) == (2, 1)


# Key lifetime


def test_a_record_lives_past_the_message_expiry_by_the_margin():
    assert key_ttl_ms(State(Status.COMPLETED, expires_at_ms=NOW + DAY), NOW, 5) == DAY + 5


def test_a_record_outlives_a_lease_or_retry_that_ends_after_the_message_expires():
    state = running(lease_deadline_ms=NOW + 2 * DAY)
    assert key_ttl_ms(state, NOW, 5) == 2 * DAY + 5


def test_a_record_of_an_expired_message_still_lives_for_the_margin():
    assert key_ttl_ms(State(Status.FAILED, expires_at_ms=NOW - 1), NOW, 5) == 5


def test_reject_fails_an_unrun_message_for_the_first_copy_only():
    facts = MessageFacts("celery", "m-1", expires_at_ms=5_000)
    first, state = decide_reject(None, facts, "unknown_task", "g1", 1_000)
    assert first.outcome is Rejected.FIRST
    deadline = 1_000 + DEAD_LETTER_LEASE_MS
    assert state == State(
        Status.FAILED,
        expires_at_ms=5_000,
        dead_letter_owed=True,
        reason="unknown_task",
        owner="g1",
        lease_deadline_ms=deadline,
    )
    wait, _ = decide_reject(state, facts, "unknown_task", "g2", 1_000)
    assert (wait.outcome, wait.delay_ms) == (Rejected.WAIT, DEAD_LETTER_LEASE_MS)
    assert decide_reject(state, facts, "unknown_task", "g1", 1_001)[0].outcome is Rejected.FIRST
    _, settled = decide_dead_lettered(state)
    assert decide_reject(settled, facts, "unknown_task", "g2", 1_000)[0].outcome is Rejected.DONE
    assert decide_reject(State(Status.COMPLETED), facts, "x", "g", 1)[0].outcome is Rejected.DONE


def test_reject_waits_for_a_live_run_and_fails_a_crashed_one():
    facts = MessageFacts("celery", "m-1", expires_at_ms=5_000)
    running = State(Status.RUNNING, attempts=1, lease_deadline_ms=9_000, owner="w", token=3)
    wait, state = decide_reject(running, facts, "unknown_task", "g1", 8_000)
    assert (wait.outcome, wait.delay_ms, state) == (Rejected.WAIT, 1_000, None)
    first, state = decide_reject(running, facts, "unknown_task", "g1", 9_000)
    assert first.outcome is Rejected.FIRST
    assert state is not None and (state.attempts, state.token) == (1, 3)
