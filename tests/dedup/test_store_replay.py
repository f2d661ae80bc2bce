"""The replay rule (:func:`celery_beetle.outcome.decide_replay`) in both stores: the Lua
script ``replay.lua`` and the in-memory fake answer alike."""

from __future__ import annotations

import pytest

from celery_beetle.outcome import Claim, Limits, Replay
from celery_beetle.state import MessageFacts
from tests.dedup.conftest import ManualClock

DAY_MS = 86_400_000
LIMITS = Limits(lease_timeout_ms=60_000, attempts=1)


def message(clock: ManualClock, message_id: str = "m-1") -> MessageFacts:
    return MessageFacts("jobs", message_id, expires_at_ms=clock() + DAY_MS)


def give_up(store, msg):  # type: ignore[no-untyped-def]
    claim = store.claim(msg, LIMITS, "w1")
    store.fail(msg, claim.token, LIMITS, retryable=False, owner="w1")
    assert store.dead_lettered(msg)


def test_a_failed_message_is_reset_for_one_run_and_a_second_replay_only_publishes_again(
    store, clock
):
    msg = message(clock)
    give_up(store, msg)
    assert store.replay("jobs", "m-1", "d1") is Replay.RUN
    assert store.peek("jobs", "m-1") is None  # a fresh attempt budget
    assert store.replay("jobs", "m-1", "d1") is Replay.REPUBLISH
    assert store.claim(msg, LIMITS, "w2").outcome is Claim.ACQUIRED
    assert store.replay("jobs", "m-1", "d1") is Replay.REPUBLISH  # never resets the run
    store.replay_published("jobs", "m-1", "d1")
    assert store.replay("jobs", "m-1", "d1") is Replay.DONE


def test_a_completed_message_is_never_replayed(store, clock):
    msg = message(clock)
    claim = store.claim(msg, LIMITS, "w1")
    store.complete(msg, claim.token)
    assert store.replay("jobs", "m-1", "d1") is Replay.COMPLETED
    assert store.peek("jobs", "m-1") is not None


@pytest.mark.parametrize("state", ["running", "owed"])
def test_a_message_in_flight_or_owing_its_dead_letter_is_left_alone(store, clock, state):
    msg = message(clock)
    claim = store.claim(msg, LIMITS, "w1")
    if state == "owed":
        store.fail(msg, claim.token, LIMITS, retryable=False, owner="w1")
    assert store.replay("jobs", "m-1", "d1") is Replay.IN_FLIGHT
    assert store.peek("jobs", "m-1") is not None


def test_another_dead_letter_of_the_message_is_judged_by_the_record_not_the_mark(store, clock):
    msg = message(clock)
    give_up(store, msg)
    assert store.replay("jobs", "m-1", "d1") is Replay.RUN
    claim = store.claim(msg, LIMITS, "w2")
    store.complete(msg, claim.token)
    assert store.replay("jobs", "m-1", "twin") is Replay.COMPLETED


def test_a_message_without_a_record_is_replayed(store, clock):
    assert store.replay("jobs", "never-ran", "d1") is Replay.RUN
