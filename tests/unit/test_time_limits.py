"""Prefork's time limits count from the stored start, not from the moment a pool process took
the job: a wait on the store before the body is never the body's (the fault explorer's seed
90003). The real-server test is ``tests/exactly_once/test_store_wait.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery.exceptions import Reject

from celery_beetle.store.fake import FakeStore
from celery_beetle.store.outcome import Limits
from celery_beetle.store.state import MessageFacts
from celery_beetle.worker import time_limits
from celery_beetle.worker.run_claim import Lease
from celery_beetle.worker.time_limits import still_to_wait

SOFT, HARD = 3.0, 3.5


def test_a_limit_of_a_job_that_noted_nothing_fires_as_celery_set_it():
    # a plain task after a BeetleTask in the same process: the slot is the older job's
    assert still_to_wait(100.0, (90.0, 90.2), SOFT, HARD, now=103.0) == 0.0
    assert still_to_wait(100.0, (0.0, 0.0), SOFT, HARD, now=103.0) == 0.0


def test_a_limit_counts_from_the_moment_the_lease_was_set():
    # taken at 100, the start's reply came 1.1 s later: the soft limit is due at 104.1
    assert still_to_wait(100.0, (100.0, 101.1), SOFT, HARD, now=103.0) == pytest.approx(1.1)
    assert still_to_wait(100.0, (100.0, 101.1), SOFT, HARD, now=104.1) == 0.0
    # no wait: the limit fires as Celery set it
    assert still_to_wait(100.0, (100.0, 100.001), SOFT, HARD, now=103.0) == 0.0


def test_a_limit_counted_from_the_gates_claim_before_the_job_was_taken_fires_on_time():
    # the gate claimed at 100.0 for a free process, which took the job at 100.1 and noted
    # its begin at 100.2: the limit is due by then, and fires at Celery's own time
    assert still_to_wait(100.1, (100.2, 100.0), SOFT, HARD, now=103.1) == 0.0
    assert still_to_wait(100.1, (100.2, 100.0), SOFT, HARD, now=103.5) == 0.0


def test_a_limit_waits_while_the_body_still_waits_on_the_store_but_not_forever():
    assert 0 < still_to_wait(100.0, (100.0, 0.0), SOFT, HARD, now=103.0) <= 0.1
    assert still_to_wait(100.0, (100.0, 0.0), SOFT, HARD, now=100.0 + SOFT + HARD) == 0.0


def test_a_pool_process_notes_its_wait_and_when_its_limits_count_from(monkeypatch):
    monkeypatch.setattr(time_limits, "current_process", lambda: SimpleNamespace(index=3))
    time_limits.waiting_on_the_store(50.0)
    assert time_limits.read_slot(3) == (50.0, 0.0)
    time_limits.limits_count_from(51.5)
    assert time_limits.read_slot(3) == (50.0, 51.5)
    assert time_limits.read_slot(time_limits.SLOTS) == (0.0, 0.0)


def test_the_main_process_notes_nothing(monkeypatch):
    monkeypatch.setattr(time_limits, "current_process", lambda: SimpleNamespace(name="Main"))
    before = bytes(time_limits._table)
    time_limits.waiting_on_the_store(50.0)
    time_limits.limits_count_from(51.5)
    assert bytes(time_limits._table) == before


class _Hub:
    def __init__(self) -> None:
        self.later: list[tuple[float, object, tuple]] = []

    def call_later(self, delay: float, fun: object, *args: object) -> object:
        self.later.append((delay, fun, args))
        return object()


class _Pool:
    """What :func:`count_limits_from_the_start` uses of Celery's ``AsynPool``."""

    def __init__(self, accepted: float) -> None:
        self.fired: list[str] = []
        self._tref_for_id: dict[int, object] = {}
        self._cache = {7: SimpleNamespace(_time_accepted=accepted, _worker_pid=4242, _timeout=HARD)}

    def _process_by_pid(self, pid: int) -> tuple[object, int | None]:
        return (SimpleNamespace(index=5), 0) if pid == 4242 else (None, None)

    def _on_soft_timeout(self, job: int, soft: float, hard: float, hub: object) -> None:
        self.fired.append("soft")

    def _on_hard_timeout(self, job: int) -> None:
        self.fired.append("hard")


def _installed(monkeypatch, slot: tuple[float, float], now: float) -> tuple[_Pool, _Hub]:
    pool, hub = _Pool(accepted=100.0), _Hub()
    monkeypatch.setattr(time_limits, "read_slot", lambda index: slot if index == 5 else (0, 0))
    monkeypatch.setattr(time_limits.time, "monotonic", lambda: now)
    assert time_limits.count_limits_from_the_start(SimpleNamespace(_pool=pool), hub)
    return pool, hub


def test_a_soft_limit_due_before_the_body_had_its_time_is_moved_on_the_event_loop(monkeypatch):
    pool, hub = _installed(monkeypatch, (100.0, 101.1), now=103.0)
    pool._on_soft_timeout(7, SOFT, HARD, hub)
    assert pool.fired == []
    ((delay, again, args),) = hub.later
    assert delay == pytest.approx(1.1) and args == (7, SOFT, HARD, hub)
    assert again is pool._on_soft_timeout, "checked again when due"
    assert 7 in pool._tref_for_id, "the job's end cancels the moved limit"


def test_a_hard_limit_alone_is_moved_too(monkeypatch):
    pool, hub = _installed(monkeypatch, (100.0, 101.1), now=103.5)
    pool._on_hard_timeout(7)
    assert pool.fired == [] and hub.later[0][0] == pytest.approx(1.1)


def test_limits_of_a_body_that_had_its_time_fire_at_once(monkeypatch):
    pool, hub = _installed(monkeypatch, (100.0, 100.002), now=103.6)
    pool._on_soft_timeout(7, SOFT, HARD, hub)
    pool._on_hard_timeout(7)
    assert pool.fired == ["soft", "hard"] and hub.later == []


def test_a_pool_without_celerys_time_limit_handlers_is_left_alone():
    assert not time_limits.count_limits_from_the_start(SimpleNamespace(_pool=None), _Hub())
    assert not time_limits.count_limits_from_the_start(SimpleNamespace(), _Hub())


# -- the run: a slow reply renews the lease before the body ----------------------------------

LIMITS = Limits(lease_timeout_ms=4_000, attempts=2, exceptions=0)


def _lease_for_the_body(store: FakeStore, sent_ago_s: float, then_ms: int = 0):
    """(the claim, what lease_for_the_body answers when the reply came ``then_ms`` later)"""
    facts = MessageFacts("celery", "m-1", store.clock() + 600_000)
    claim = store.claim(facts, LIMITS, "pool")
    sent = time_limits.time.monotonic() - sent_ago_s
    store.clock.advance(then_ms)  # type: ignore[attr-defined]
    trips = store.round_trips
    answer = time_limits.lease_for_the_body(store, facts, claim.token, LIMITS, sent, "m-1")
    return claim, sent, answer, store.round_trips - trips


class _Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def test_a_fast_start_keeps_its_lease_and_the_limits_count_from_its_sending():
    _, sent, answer, trips = _lease_for_the_body(FakeStore(clock=_Clock()), sent_ago_s=0.01)
    assert answer == (sent, None) and trips == 0, "no extra round trip"


def test_a_start_whose_reply_was_held_renews_the_lease_before_the_body():
    clock = _Clock()
    _, sent, (moment, deadline), trips = _lease_for_the_body(
        FakeStore(clock=clock), sent_ago_s=1.1, then_ms=1_100
    )
    assert moment > sent + 1.0, "the limits count from the renewal"
    assert deadline == clock() + LIMITS.lease_timeout_ms and trips == 1


def test_a_lease_taken_over_while_the_reply_was_held_hands_the_copy_back():
    clock = _Clock()
    store = FakeStore(clock=clock)
    facts = MessageFacts("celery", "m-1", clock() + 600_000)
    mine = store.claim(facts, LIMITS, "pool")
    clock.advance(5_000)  # the lease ran out; another copy claims the message
    assert store.claim(facts, LIMITS, "other").token != mine.token
    sent = time_limits.time.monotonic() - 5.0
    with pytest.raises(Reject):
        time_limits.lease_for_the_body(store, facts, mine.token, LIMITS, sent, "m-1")


# -- after the body: the outcome waits on the store, and so do the limits --------------------


def test_a_pool_process_storing_its_outcome_holds_its_limits_back(monkeypatch):
    monkeypatch.setattr(time_limits, "current_process", lambda: SimpleNamespace(index=3))
    time_limits.limits_count_from(40.0)
    monkeypatch.setattr(time_limits.time, "monotonic", lambda: 45.0)
    time_limits.storing_the_outcome()
    assert time_limits.read_slot(3) == (45.0, 0.0)
    # the job was taken at 39.9: its hard limit, due at 43.4, waits while the outcome does
    assert 0 < still_to_wait(39.9, (45.0, 0.0), HARD, HARD, now=46.0) <= 0.1
    assert still_to_wait(39.9, (45.0, 0.0), HARD, HARD, now=45.0 + 2 * HARD) == 0.0


class _DownStore:
    """A store that takes the completion at the third try, noting each try's table slot."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.tries: list[tuple[float, float]] = []

    def complete(self, facts: MessageFacts, token: int) -> object:
        import redis

        from celery_beetle.store.outcome import Fence, FenceDecision

        self.tries.append(time_limits.read_slot(self.slot))
        if len(self.tries) < 3:
            raise redis.exceptions.ConnectionError("Redis is failing over")
        return FenceDecision(Fence.OK)


def test_a_completion_redis_does_not_take_holds_the_time_limits_back_until_stored(monkeypatch):
    """Seed 97014: a body returned during a Sentinel failover shorter than its lease; its
    completion, retried in the pool process, was killed unstored by the hard time limit
    (90 % of the lease), and the next copy dead-lettered the message (attempts=1). The
    completion must hold the limits back while it waits, and try again often."""
    import time

    from celery_beetle.worker import run as run_module

    monkeypatch.setattr(time_limits, "current_process", lambda: SimpleNamespace(index=4))
    time_limits.limits_count_from(time.monotonic())
    accepted = time.monotonic()
    pauses: list[float] = []
    real = run_module.call_until_stored

    def call_until_stored(operation, what, **kwargs):
        pauses.append(kwargs.get("max_wait_s", 2.0))
        return real(operation, what, **kwargs)

    monkeypatch.setattr(run_module, "call_until_stored", call_until_stored)
    run = run_module.Run.__new__(run_module.Run)
    run.store = store = _DownStore(slot=4)
    run.facts = MessageFacts("celery", "m-1", 2_000_000_000_000)
    run.lease, run.task, run.request = (
        Lease("run-1", 7),
        SimpleNamespace(name="t"),
        SimpleNamespace(id="m-1"),
    )
    run._trace = lambda *args, **kwargs: None
    assert run._complete(accepted)
    assert len(store.tries) == 3
    for slot in store.tries:
        waiting, counts_from = slot
        assert waiting >= accepted and counts_from == 0.0, slot
        # its hard limit, due by now, waits for the completion
        assert still_to_wait(accepted, slot, HARD, HARD, now=accepted + HARD + 0.5) > 0
    assert pauses == [run_module.OUTCOME_RETRY_MAX_S] and pauses[0] <= 0.5
