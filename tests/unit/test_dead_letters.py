"""Dead letters without a broker: naming, replay headers, selection, the replay rule."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from celery_beetle.ops.dead_letters import DeadLetter, describe, select
from celery_beetle.ops.replay import REPLAY_HEADER, replay_headers
from celery_beetle.store.outcome import Replay, decide_replay
from celery_beetle.store.state import State, Status
from celery_beetle.worker.deadletter import dead_letter_headers
from kombu_beetle.envelope import EXPIRES_AT_HEADER, FLAGS_HEADER


def letter(headers, message_id="m1", task="t.a"):  # type: ignore[no-untyped-def]
    queue, scope, reason, replay_id = describe("jobs.dead", headers, message_id)
    return DeadLetter(
        message_id, queue, scope, replay_id, reason, b"[[1], {}, {}]", "application/json",
        "utf-8", {"task": task, **headers}, {"message_id": message_id},
    )  # fmt: skip


def test_a_workers_dead_letter_names_its_queue_scope_reason_and_a_stable_replay_id():
    headers = dead_letter_headers("not_retryable", "jobs", scope="jobs-scope", now_ms=5, worker="w")
    queue, scope, reason, replay_id = describe("jobs.dead", headers, "m1")
    assert (queue, scope, reason) == ("jobs", "jobs-scope", "not_retryable")
    assert describe("jobs.dead", dict(headers), "m1")[3] == replay_id  # a copy: the same id
    later = dead_letter_headers("not_retryable", "jobs", scope="jobs-scope", now_ms=6, worker="x")
    assert describe("jobs.dead", later, "m1")[3] == replay_id  # the same message: the same id
    replayed = {**later, REPLAY_HEADER: replay_id}  # dead again after a replay
    assert describe("jobs.dead", replayed, "m1")[3] != replay_id  # a new generation


def test_copies_of_one_message_dead_at_different_seconds_or_by_worker_and_broker_share_an_id():
    def broker_death(second: int) -> dict:
        when = datetime(2026, 1, 1, 0, 0, second, tzinfo=timezone.utc)
        return {"x-death": [{"queue": "jobs", "reason": "expired", "time": when, "count": 1}]}

    worker = dead_letter_headers("not_retryable", "jobs", now_ms=5, worker="w")
    ids = {describe("jobs.dead", h, "m1")[3] for h in (broker_death(1), broker_death(2), worker)}
    assert len(ids) == 1
    assert describe("jobs.dead", broker_death(1), "m2")[3] not in ids  # another message
    assert (
        describe("jobs.dead", broker_death(1), None)[3]
        != describe("jobs.dead", broker_death(2), None)[3]
    ), "without a message id there is nothing to group by"


def test_a_brokers_dead_letter_is_named_from_x_death():
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    headers = {
        "x-death": [
            {"queue": "jobs", "reason": "expired", "time": when, "count": 1},
            {"queue": "jobs.delay.500", "reason": "expired", "time": when, "count": 1},
        ]
    }
    queue, scope, reason, _ = describe("jobs.dead", headers, "m1")
    assert (queue, scope, reason) == ("jobs", "jobs", "broker:expired")
    assert letter(headers).dead_at_ms == int(when.timestamp() * 1000)


def test_a_replay_restores_redundancy_drops_death_headers_and_the_old_expiry():
    headers = dead_letter_headers("attempts_limit", "jobs", now_ms=5)
    headers.update({"x-beetle-dead-flags": 3, EXPIRES_AT_HEADER: 1, "x-death": []})
    out = replay_headers(letter(headers))
    assert out[FLAGS_HEADER] == 1  # redundant, no longer degraded
    assert EXPIRES_AT_HEADER not in out and "x-death" not in out
    assert not any(k.startswith("x-beetle-dead-") for k in out)
    assert out["task"] == "t.a" and out[REPLAY_HEADER] == letter(headers).replay_id
    assert replay_headers(letter(headers), 7_000)[EXPIRES_AT_HEADER] == 7  # the replay's own


def test_a_dead_letter_knows_its_message_s_expiry_from_either_kind_of_header():
    worker = dead_letter_headers("attempts_limit", "jobs", now_ms=5)
    assert letter({**worker, "x-beetle-dead-expires-at": 1_800_000_000}).expires_at_ms == (
        1_800_000_000_000
    )
    assert letter({EXPIRES_AT_HEADER: 1_800_000_000.5}).expires_at_ms == 1_800_000_000_500
    assert letter({}).expires_at_ms is None
    assert letter({EXPIRES_AT_HEADER: "inf"}).expires_at_ms is None


def test_selection_needs_a_name_and_matches_ids_or_tasks():
    a, b = letter({}, "m1", "t.a"), letter({}, "m2", "t.b")
    assert select([a, b], ids=["m2"]) == [b]
    assert select([a, b], task="t.a") == [a]
    assert select([a, b], everything=True) == [a, b]
    with pytest.raises(ValueError, match="name the dead letters"):
        select([a, b])


def test_arguments_are_decoded_and_cut():
    assert letter({}).arguments() == '{"args": [1], "kwargs": {}}'
    assert letter({}).arguments(limit=5).startswith('{"arg... (')


NOW = 1_000_000
OPEN, OVER = NOW + 1, NOW  # a dedup window that ends after now / that has ended


@pytest.mark.parametrize(
    ("state", "mark", "window", "expected"),
    [
        (None, None, OPEN, Replay.RUN),  # within its window: no copy was ever claimed
        (None, None, OVER, Replay.REFUSED),  # a twin may have completed; its record expired
        (None, None, 0, Replay.REFUSED),  # no expiry known: nothing to prove it with
        (State(Status.FAILED), None, OVER, Replay.RUN),  # given up, its dead letter stored
        (State(Status.FAILED, dead_letter_owed=True), None, OPEN, Replay.IN_FLIGHT),
        (State(Status.COMPLETED), None, OVER, Replay.COMPLETED),
        (State(Status.RUNNING), None, OPEN, Replay.IN_FLIGHT),
        (State(Status.PENDING), None, OPEN, Replay.IN_FLIGHT),
        (State(Status.RUNNING), f"r:d1:{OVER}", OVER, Replay.REPUBLISH),  # a record: dedup
        (None, f"r:d1:{OPEN}", OVER, Replay.REPUBLISH),  # its copy not claimed yet
        (None, f"r:d1:{OVER}", OPEN, Replay.REFUSED),  # its copy may have run
        (None, "r:d1", OPEN, Replay.REFUSED),  # a mark of an older version: no expiry
        (None, f"p:d1:{OVER}", OVER, Replay.DONE),
        (None, "p:d1", OVER, Replay.DONE),
        (State(Status.COMPLETED), f"p:other:{OPEN}", OPEN, Replay.COMPLETED),
        (None, f"p:other:{OPEN}", OPEN, Replay.IN_FLIGHT),  # another replay's copy, queued
        (None, f"p:other:{OVER}", OPEN, Replay.REFUSED),  # that copy may have completed
    ],
)
def test_the_replay_rule(state, mark, window, expected):
    assert decide_replay(state, mark, "d1", window, NOW) is expected


@pytest.mark.parametrize(
    ("mark", "window", "expected"),
    [
        (None, OVER, Replay.RUN),
        (f"r:d1:{OVER}", OVER, Replay.REPUBLISH),
        (f"p:other:{OVER}", OPEN, Replay.RUN),
    ],
)
def test_force_runs_only_what_was_refused(mark, window, expected):
    assert decide_replay(None, mark, "d1", window, NOW, force=True) is expected
    assert decide_replay(State(Status.COMPLETED), None, "d1", OVER, NOW, force=True) is (
        Replay.COMPLETED
    )
    running = State(Status.RUNNING)
    assert decide_replay(running, None, "d1", OVER, NOW, force=True) is Replay.IN_FLIGHT
