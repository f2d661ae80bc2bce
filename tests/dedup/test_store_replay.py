"""The replay rule (:func:`celery_beetle.store.outcome.decide_replay`) in both stores: the Lua
script ``replay.lua`` and the in-memory fake answer alike. Both read the test's clock, so a
dedup window ends without sleeping (a record's own expiry is Redis's, so "the record
expired" is played as "there never was one")."""

from __future__ import annotations

from celery_beetle.store import REPLAY_MARK_TTL_MS
from celery_beetle.store.outcome import DEAD_LETTER_RETENTION_MS, Claim, Limits, Replay
from celery_beetle.store.state import MessageFacts
from tests.dedup.conftest import ManualClock

DAY_MS = 86_400_000
LIMITS = Limits(lease_timeout_ms=60_000, attempts=1)


def message(clock: ManualClock, message_id: str = "m-1") -> MessageFacts:
    return MessageFacts("jobs", message_id, expires_at_ms=clock() + DAY_MS)


def give_up(store, msg):  # type: ignore[no-untyped-def]
    claim = store.claim(msg, LIMITS, "w1")
    store.fail(msg, claim.token, LIMITS, retryable=False, owner="w1")
    assert store.dead_lettered(msg)


def replay(store, clock, replay_id="d1", message_id="m-1", *, window_ms=DAY_MS, **kwargs):  # type: ignore[no-untyped-def]
    """Replay dead letter ``replay_id`` of a message whose window ends ``window_ms`` from now;
    the replay's copy would expire in a day."""
    return store.replay(
        "jobs",
        message_id,
        replay_id,
        window_end_ms=clock() + window_ms,
        expires_at_ms=clock() + DAY_MS,
        **kwargs,
    )


def test_a_failed_message_is_reset_for_one_run_and_a_second_replay_only_publishes_again(
    store, clock
):
    msg = message(clock)
    give_up(store, msg)
    first = replay(store, clock)
    assert first == (Replay.RUN, clock() + DAY_MS)
    assert store.peek("jobs", "m-1") is None  # a fresh attempt budget
    clock.advance(60_000)
    again = replay(store, clock)
    assert again == (Replay.REPUBLISH, first.expires_at_ms), "the first publish's expiry"
    assert store.claim(msg, LIMITS, "w2").outcome is Claim.ACQUIRED
    assert replay(store, clock).outcome is Replay.REPUBLISH  # never resets the run
    store.replay_published("jobs", "m-1", "d1", first.expires_at_ms)
    assert replay(store, clock).outcome is Replay.DONE


def test_a_completed_message_is_never_replayed(store, clock):
    msg = message(clock)
    claim = store.claim(msg, LIMITS, "w1")
    store.complete(msg, claim.token)
    assert replay(store, clock).outcome is Replay.COMPLETED
    assert replay(store, clock, force=True).outcome is Replay.COMPLETED
    assert store.peek("jobs", "m-1") is not None


def test_a_message_in_flight_or_owing_its_dead_letter_is_left_alone(store, clock):
    for state, message_id in (("running", "m-1"), ("owed", "m-2")):
        msg = message(clock, message_id)
        claim = store.claim(msg, LIMITS, "w1")
        if state == "owed":
            store.fail(msg, claim.token, LIMITS, retryable=False, owner="w1")
        assert replay(store, clock, message_id=message_id).outcome is Replay.IN_FLIGHT
        assert store.peek("jobs", message_id) is not None


def test_another_dead_letter_of_the_message_is_judged_by_the_record_not_the_mark(store, clock):
    msg = message(clock)
    give_up(store, msg)
    assert replay(store, clock).outcome is Replay.RUN
    claim = store.claim(msg, LIMITS, "w2")
    store.complete(msg, claim.token)
    assert replay(store, clock, "twin").outcome is Replay.COMPLETED


def test_a_message_without_a_record_is_replayed_only_within_its_dedup_window(store, clock):
    assert replay(store, clock, message_id="never-ran").outcome is Replay.RUN
    refused = replay(store, clock, message_id="may-have-run", window_ms=0)
    assert refused.outcome is Replay.REFUSED
    assert store.replay_mark("jobs", "may-have-run") is None, "a refusal writes nothing"
    forced = replay(store, clock, message_id="may-have-run", window_ms=0, force=True)
    assert forced.outcome is Replay.RUN
    assert store.replay_mark("jobs", "may-have-run") == f"r:d1:{forced.expires_at_ms}"


def test_a_replay_resumed_after_its_copy_s_window_is_refused_unless_forced(store, clock):
    msg = message(clock)
    give_up(store, msg)
    first = replay(store, clock)
    clock.advance(DAY_MS)  # the copy it published has expired; no record of a run is left
    assert replay(store, clock).outcome is Replay.REFUSED
    assert replay(store, clock, force=True) == (Replay.REPUBLISH, first.expires_at_ms)


def test_a_copy_another_dead_letter_s_replay_published_is_waited_for_within_its_window(
    store, clock
):
    published = replay(store, clock, "d1", window_ms=0, force=True)
    store.replay_published("jobs", "m-1", "d1", published.expires_at_ms)
    assert replay(store, clock, "d2").outcome is Replay.IN_FLIGHT
    clock.advance(DAY_MS)  # that copy may have run and completed, its record gone
    assert replay(store, clock, "d2").outcome is Replay.REFUSED


def test_a_given_up_message_s_record_is_kept_as_long_as_its_dead_letter_may_wait(store, clock):
    give_up(store, message(clock))
    ttl = store.ttl_ms("jobs", "m-1")
    assert ttl is not None and ttl >= DEAD_LETTER_RETENTION_MS, "past the day of its window"
    store.dead_letter_retention_ms = 0
    give_up(store, message(clock, "m-2"))
    ttl = store.ttl_ms("jobs", "m-2")
    assert ttl is not None and ttl <= DAY_MS + store.ttl_margin_ms


def test_a_replay_mark_outlives_the_windows_it_judges(store, clock):
    """A mark ending before a window would let the clock alone run the dead letter again."""
    year_ms = 366 * DAY_MS
    result = store.replay("jobs", "m-1", "d1", window_end_ms=clock() + year_ms, expires_at_ms=1)
    assert result.outcome is Replay.RUN
    key = store.replay_mark_key("jobs", "m-1")
    fake = hasattr(store, "marks")
    ttl = store.marks[key][1] - clock() if fake else store.client.pttl(key)
    assert ttl > REPLAY_MARK_TTL_MS and ttl >= year_ms
