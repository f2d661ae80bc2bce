"""The lease a prefork run takes before its body, by what the gate's claim gave it (FakeStore,
no server): a claim in full for a free process needs no call, a reservation needs its start."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from celery_beetle.store.fake import FakeStore
from celery_beetle.store.outcome import Limits
from celery_beetle.store.state import MessageFacts
from celery_beetle.worker import run_claim, time_limits
from celery_beetle.worker.facts import GateClaim
from celery_beetle.worker.run_calls import RetriedCalls
from celery_beetle.worker.run_claim import RunClaim

LIMITS = Limits(lease_timeout_ms=4_000, attempts=1, exceptions=0)


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def in_a_pool_process(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Run as a prefork pool process does; returns when its time limits count from."""
    process = SimpleNamespace(name="ForkPoolWorker-1")
    monkeypatch.setattr(run_claim, "current_process", lambda: process)
    monkeypatch.setattr(run_claim.run_state, "on_the_event_loop", lambda: False)
    counts_from: list[float] = []
    monkeypatch.setattr(time_limits, "limits_count_from", counts_from.append)
    monkeypatch.setattr(time_limits, "waiting_on_the_store", lambda moment: None)
    return counts_from


def _claim(store: FakeStore, facts: MessageFacts) -> RunClaim:
    task = SimpleNamespace(acks_late=True, soft_time_limit=None)
    request = SimpleNamespace(timelimit=(None, None))
    return RunClaim(
        store, facts, LIMITS, RetriedCalls(task, request, "t[1]"),
        name="t[1]", acks_late=True, trace=lambda *a, **k: None, give_up=_no_give_up,
    )  # fmt: skip


def _no_give_up(*args: Any) -> Any:
    raise AssertionError(f"gave up: {args}")


def test_a_body_claimed_in_full_for_its_process_begins_without_a_call(in_a_pool_process):
    store = FakeStore(clock=Clock())
    facts = MessageFacts("jobs", "m1", store.clock() + 600_000)
    sent_at = time.monotonic() - 0.02
    decision = store.claim(facts, LIMITS, "gate-owner")  # the gate's claim in full
    given = GateClaim(
        "gate-owner", decision.token, decision.attempt, decision.lease_deadline_ms,
        started=True, sent_at=sent_at,
    )  # fmt: skip
    trips = store.round_trips
    lease = _claim(store, facts).before_the_body(given, "pool-owner")
    assert store.round_trips == trips, "no round trip between the delivery and its body"
    assert (lease.token, lease.attempt) == (decision.token, 1) and lease.gate_completes
    assert in_a_pool_process == [sent_at], "its limits count from the gate's claim"


def test_a_claim_in_full_that_reached_its_process_late_renews_its_lease_first(in_a_pool_process):
    store = FakeStore(clock=Clock())
    facts = MessageFacts("jobs", "m1", store.clock() + 600_000)
    decision = store.claim(facts, LIMITS, "gate-owner")
    sent_at = time.monotonic() - 1.5  # the job waited: part of the lease is gone
    given = GateClaim(
        "gate-owner", decision.token, decision.attempt, decision.lease_deadline_ms,
        started=True, sent_at=sent_at,
    )  # fmt: skip
    trips = store.round_trips
    _claim(store, facts).before_the_body(given, "pool-owner")
    assert store.round_trips == trips + 1, "one renewal"
    assert in_a_pool_process[0] > sent_at + 1.0, "the limits count from the renewal"


def test_a_reservation_is_started_before_the_body_and_counts_its_attempt(in_a_pool_process):
    store = FakeStore(clock=Clock())
    facts = MessageFacts("jobs", "m1", store.clock() + 600_000)
    decision = store.claim(facts, LIMITS, "gate-owner", 10_000)  # a reservation
    assert store.peek("jobs", "m1").attempts == 0
    given = GateClaim("gate-owner", decision.token, decision.attempt, decision.lease_deadline_ms)
    trips = store.round_trips
    lease = _claim(store, facts).before_the_body(given, "pool-owner")
    assert store.round_trips == trips + 1 and lease.attempt == 1
    assert store.peek("jobs", "m1").attempts == 1
