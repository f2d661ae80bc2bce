"""LeaseKeeper with a FakeStore and a manual clock: the heartbeat thread runs, nothing sleeps.

The keeper's ``wait`` is replaced by :class:`Waits`, which moves the clock by the requested
delay at once; the thread therefore runs its whole schedule in microseconds, and each test
waits (bounded) for it to end before looking at what it did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadPool
from redis.exceptions import ConnectionError as RedisConnectionError

from celery_beetle.store.fake import FakeStore
from celery_beetle.store.outcome import Claim, FenceDecision, Limits
from celery_beetle.store.state import MessageFacts
from celery_beetle.testing.waiting import wait_until
from celery_beetle.worker.lease import LeaseKeeper, pool_enforces_time_limits

NOW_MS = 1_800_000_000_000
FACTS = MessageFacts("orders", "m-1", expires_at_ms=NOW_MS + 86_400_000)


class Clock:
    def __init__(self) -> None:
        self.ms = NOW_MS

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += round(seconds * 1000)


class Waits:
    """The keeper's ``wait``: moves the clock by each delay; stops after ``stop_after`` waits.

    ``before[i]`` runs before the i-th wait returns (0-based): a takeover, say.
    """

    def __init__(self, clock: Clock, stop_after: int) -> None:
        self.clock = clock
        self.stop_after = stop_after
        self.delays: list[float] = []
        self.before: dict[int, Callable[[], None]] = {}

    def __call__(self, seconds: float) -> bool:
        index = len(self.delays)
        self.delays.append(seconds)
        self.clock.advance(seconds)
        if index in self.before:
            self.before[index]()
        return len(self.delays) >= self.stop_after


class SpyStore(FakeStore):
    """A FakeStore that records when ``extend`` is called and fails as planned."""

    def __init__(self, clock: Clock, failures: list[BaseException | None] | None = None) -> None:
        super().__init__(clock=clock)
        self.extend_times: list[int] = []
        self.failures = list(failures or [])

    def extend(self, facts: MessageFacts, token: int, lease_timeout_ms: int) -> FenceDecision:
        self.extend_times.append(self.clock())
        if self.failures:
            failure = self.failures.pop(0)
            if failure is not None:
                raise failure
        return super().extend(facts, token, lease_timeout_ms)


def limits(lease_s: float) -> Limits:
    return Limits(lease_timeout_ms=round(lease_s * 1000), attempts=2, exceptions=1)


def claimed(store: FakeStore, lease_s: float) -> int:
    claim = store.claim(FACTS, limits(lease_s), "worker-1")
    assert claim.outcome is Claim.ACQUIRED
    return claim.token


def run_to_end(keeper: LeaseKeeper) -> None:
    keeper.start()
    assert wait_until(lambda: not keeper.running, timeout=5, interval=0.005)


def test_the_keeper_extends_the_lease_every_third_of_it_so_it_outlives_its_first_deadline():
    clock = Clock()
    store = SpyStore(clock)
    token = claimed(store, lease_s=3)
    waits = Waits(clock, stop_after=4)
    keeper = LeaseKeeper(store, FACTS, token, 3_000, wait=waits)
    run_to_end(keeper)
    assert waits.delays == [1.0, 1.0, 1.0, 1.0]
    assert store.extend_times == [NOW_MS + 1_000, NOW_MS + 2_000, NOW_MS + 3_000]
    assert keeper.extensions == 3 and not keeper.lost
    assert keeper.lease_deadline_ms == NOW_MS + 6_000
    clock.ms = NOW_MS + 5_000  # past the claim's own deadline (3 s), within the extended one
    assert store.claim(FACTS, limits(3), "worker-2").outcome is Claim.LOCKED


def test_the_interval_between_extensions_is_configurable():
    clock = Clock()
    store = SpyStore(clock)
    waits = Waits(clock, stop_after=3)
    keeper = LeaseKeeper(store, FACTS, claimed(store, 3), 3_000, interval_s=0.25, wait=waits)
    run_to_end(keeper)
    assert waits.delays == [0.25, 0.25, 0.25]
    assert store.extend_times == [NOW_MS + 250, NOW_MS + 500]


def test_a_takeover_stops_the_keeper_marks_the_lease_lost_and_warns(caplog):
    clock = Clock()
    store = SpyStore(clock)
    waits = Waits(clock, stop_after=10)
    takeovers: list[Claim] = []

    def taken_over() -> None:  # the lease ran out and another worker claimed the message
        clock.advance(5)
        takeovers.append(store.claim(FACTS, limits(3), "worker-2").outcome)

    waits.before[1] = taken_over
    keeper = LeaseKeeper(store, FACTS, claimed(store, 3), 3_000, wait=waits)
    with caplog.at_level(logging.WARNING, logger="celery_beetle.worker.lease"):
        run_to_end(keeper)
    assert takeovers == [Claim.ACQUIRED]
    assert keeper.lost
    assert keeper.extensions == 1
    assert len(waits.delays) == 2, "no waiting, and no extending, after the takeover"
    assert "orders/m-1 was taken over" in caplog.text


def test_a_store_error_is_logged_and_retried_at_the_next_beat(caplog):
    clock = Clock()
    store = SpyStore(clock, failures=[RedisConnectionError("refused")])
    waits = Waits(clock, stop_after=3)
    keeper = LeaseKeeper(store, FACTS, claimed(store, 30), 30_000, wait=waits)
    with caplog.at_level(logging.WARNING, logger="celery_beetle.worker.lease"):
        run_to_end(keeper)
    assert waits.delays == [10.0, 10.0, 10.0]
    assert (keeper.failures, keeper.extensions, keeper.lost) == (1, 1, False)
    assert "cannot extend the lease of orders/m-1" in caplog.text


def test_store_errors_near_the_lease_end_are_retried_sooner_until_one_goes_through():
    clock = Clock()
    down = RedisConnectionError("timed out")
    store = SpyStore(clock, failures=[down, down, down])
    waits = Waits(clock, stop_after=5)
    keeper = LeaseKeeper(store, FACTS, claimed(store, 30), 30_000, wait=waits)
    run_to_end(keeper)
    # beats at 10 s (fails, 20 s left: the usual 10), 20 s (fails, 10 s left: half of it),
    # 25 s (fails, 5 s left), 27.5 s (goes through, the lease now ends at 57.5 s)
    assert waits.delays == [10.0, 10.0, 5.0, 2.5, 10.0]
    assert keeper.lease_deadline_ms == NOW_MS + 57_500


def test_an_unexpected_exception_is_logged_with_its_traceback_and_the_keeper_keeps_going(caplog):
    clock = Clock()
    store = SpyStore(clock, failures=[RuntimeError("a bug")])
    waits = Waits(clock, stop_after=3)
    keeper = LeaseKeeper(store, FACTS, claimed(store, 3), 3_000, wait=waits)
    with caplog.at_level(logging.WARNING, logger="celery_beetle.worker.lease"):
        run_to_end(keeper)
    assert (keeper.failures, keeper.extensions) == (1, 1)
    [record] = [r for r in caplog.records if r.exc_info]
    assert "RuntimeError: a bug" in caplog.text and record.levelno == logging.ERROR


def test_stop_ends_the_daemon_thread_at_once_and_may_be_called_again():
    store = FakeStore()
    claim = store.claim(FACTS, limits(60), "worker-1")
    keeper = LeaseKeeper(store, FACTS, claim.token, 60_000)  # the real Event wait, 20 s
    keeper.stop()  # before start: nothing to end
    keeper = LeaseKeeper(store, FACTS, claim.token, 60_000)
    keeper.start()
    assert keeper.running and keeper._thread is not None and keeper._thread.daemon
    keeper.stop()
    assert not keeper.running, "stop() interrupts the wait instead of sitting out the interval"
    keeper.stop()
    assert keeper.extensions == 0 and not keeper.lost


def test_as_a_context_manager_the_keeper_extends_while_the_block_runs():
    store = FakeStore()
    claim = store.claim(FACTS, limits(60), "worker-1")
    with LeaseKeeper(store, FACTS, claim.token, 60_000, interval_s=0.01) as keeper:
        assert wait_until(lambda: keeper.extensions >= 3, timeout=5, interval=0.005)
    assert not keeper.running


def test_a_keeper_is_started_once():
    store = FakeStore()
    keeper = LeaseKeeper(store, FACTS, 1, 60_000)
    keeper.start()
    try:
        with pytest.raises(RuntimeError, match="one keeper per run"):
            keeper.start()
    finally:
        keeper.stop()


@pytest.mark.parametrize(
    "pool",
    ["prefork", "processes", "Prefork", "celery.concurrency.prefork:TaskPool", PreforkPool],
)
def test_prefork_pools_enforce_time_limits(pool):
    assert pool_enforces_time_limits(pool)


def test_a_subclass_or_instance_of_the_prefork_pool_enforces_time_limits():
    class MyPool(PreforkPool):
        pass

    assert pool_enforces_time_limits(MyPool)
    assert pool_enforces_time_limits(PreforkPool.__new__(PreforkPool))


@pytest.mark.parametrize(
    "pool", ["solo", "threads", "gevent", "eventlet", "custom", "", SoloPool, ThreadPool]
)
def test_solo_threads_green_and_custom_pools_do_not_enforce_time_limits(pool):
    assert not pool_enforces_time_limits(pool)


def test_a_refusal_that_answers_after_stop_is_not_reported_as_a_takeover(caplog):
    clock = Clock()

    class BodyEndsDuringExtend(SpyStore):
        """The run stops the keeper and completes while an extension is in flight."""

        def extend(self, facts: MessageFacts, token: int, lease_timeout_ms: int) -> FenceDecision:
            keeper.stop()
            self.complete(facts, token)
            return super().extend(facts, token, lease_timeout_ms)

    store = BodyEndsDuringExtend(clock)
    token = claimed(store, 3)
    keeper = LeaseKeeper(store, FACTS, token, 3_000, wait=Waits(clock, stop_after=10))
    with caplog.at_level(logging.WARNING, logger="celery_beetle.worker.lease"):
        run_to_end(keeper)
    assert store.extend_times == [NOW_MS + 1_000]
    assert not keeper.lost and "taken over" not in caplog.text
