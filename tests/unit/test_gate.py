"""The gate's decisions, with a FakeStore, a manual clock and a manual timer: no server."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from celery_beetle.store.fake import FakeStore
from celery_beetle.store.outcome import Limits
from celery_beetle.store.state import MessageFacts
from celery_beetle.worker.facts import FACTS_HEADER, facts_from_headers, message_facts
from celery_beetle.worker.gate import DeliveryGate

NOW_MS = 1_800_000_000_000
LIMITS = Limits(lease_timeout_ms=10_000, attempts=3, exceptions=2, delay_ms=1_000)


class Clock:
    def __init__(self) -> None:
        self.ms = NOW_MS

    def __call__(self) -> int:
        return self.ms


class Timer:
    """``call_later`` that runs callbacks only when the test moves the clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.entries: list[tuple[int, Callable[[], None]]] = []

    def __call__(self, seconds: float, fn: Callable[[], None]) -> None:
        self.entries.append((self.clock.ms + int(seconds * 1000), fn))

    def advance(self, seconds: float = 0.0) -> None:
        self.clock.ms += int(seconds * 1000)
        while True:
            due = [e for e in self.entries if e[0] <= self.clock.ms]
            if not due:
                return
            for entry in due:
                self.entries.remove(entry)
                entry[1]()


class QoS:
    def __init__(self) -> None:
        self.extra = 0

    def increment_eventually(self, n: int = 1) -> int:
        self.extra += n
        return self.extra

    def decrement_eventually(self, n: int = 1) -> int:
        self.extra -= n
        return self.extra


class Channel:
    is_open = True
    connection = object()


class Message:
    def __init__(
        self,
        message_id: str | None = "m1",
        headers: dict[str, Any] | None = None,
        decodes: bool = True,
        broker: str = "rabbit-a",
    ) -> None:
        self.headers = {"id": "task-1", "task": "t.beetle", **(headers or {})}
        self.properties = {"message_id": message_id, "application_headers": self.headers}
        self.delivery_info = {"routing_key": "jobs", "beetle_broker": broker}
        self.channel = Channel()
        self.acks = 0
        self._decodes = decodes

    @property
    def payload(self) -> Any:
        if not self._decodes:
            raise ValueError("not json")
        return ((), {}, {})

    def ack(self) -> None:
        self.acks += 1


class DownStore(FakeStore):
    """A FakeStore that can be switched off like an unreachable Redis."""

    down = False

    def peek(self, queue: str, message_id: str) -> Any:
        if self.down:
            raise RedisConnectionError("connection refused")
        return super().peek(queue, message_id)


class Harness:
    def __init__(self) -> None:
        self.clock = Clock()
        self.timer = Timer(self.clock)
        self.qos = QoS()
        self.store = DownStore(clock=self.clock)
        self.dead: list[tuple[Any, str, str, str]] = []
        self.started: list[tuple[Message, Callable[[], None]]] = []
        self.redis_answers = True
        self.gate = self.rebuild()

    def rebuild(self, **options: Any) -> DeliveryGate:
        """A new gate on the harness's fakes, with ``options`` (the gate's fields) given."""
        given: dict[str, Any] = {
            "store": self.store,
            "call_later": self.timer,
            "qos": lambda: self.qos,
            "dead_letter": lambda *args: self.dead.append(args),
            "queue_of": lambda message: message.delivery_info["routing_key"],
            "probe": lambda: self.redis_answers,
            "clock": self.clock,
        }
        self.gate = DeliveryGate(**{**given, **options})
        return self.gate

    def deliver(self, message: Message) -> str:
        return self.gate.handle(
            message, "t.beetle", lambda done: self.started.append((message, done))
        )

    def facts(self, message_id: str = "m1") -> MessageFacts:
        return MessageFacts("jobs", message_id, NOW_MS + 86_400_000)

    def run_elsewhere(self, message_id: str = "m1") -> int:
        claim = self.store.claim(self.facts(message_id), LIMITS, "other-host:1")
        assert claim.acquired
        return claim.token


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_first_copy_runs_and_second_copy_waits_for_it_without_reading_redis(h):
    assert h.deliver(Message(broker="rabbit-a")) == "run"
    reads = h.store.round_trips
    assert h.deliver(Message(broker="rabbit-b")) == "waiting"
    assert h.store.round_trips == reads
    assert len(h.started) == 1
    assert h.qos.extra == 0


def test_waiting_copy_is_acked_as_a_duplicate_once_its_twin_completes(h):
    first, second = Message(), Message()
    h.deliver(first)
    h.deliver(second)
    _, done = h.started[0]
    claim = h.store.claim(h.facts(), LIMITS, "me:1")
    h.store.complete(h.facts(), claim.token)
    done.finished()
    h.timer.advance()
    assert second.acks == 1
    assert len(h.started) == 1
    assert h.store.round_trips == 4, "gate read, claim, complete, gate read of the twin"
    assert h.gate.stats["duplicate"] == 1


def test_a_finished_run_frees_its_delivery_without_the_cyclic_garbage_collector(h):
    # a reference cycle would keep every message and request until a collection, and the
    # full collections pause the worker's main process for tens of milliseconds
    gc.disable()
    try:
        message = Message()
        h.deliver(message)
        done = h.started.pop()[1]
        done.finished()
        h.timer.advance()
        freed = weakref.ref(message)
        del message, done
        assert freed() is None
    finally:
        gc.enable()


def test_copy_of_a_completed_message_is_acked_with_one_read(h):
    token = h.run_elsewhere()
    h.store.complete(h.facts(), token)
    before = h.store.round_trips
    message = Message()
    assert h.deliver(message) == "duplicate"
    assert message.acks == 1
    assert h.store.round_trips - before == 1
    assert h.started == []


def test_copy_of_a_message_running_elsewhere_is_deferred_with_a_wider_prefetch_window(h):
    token = h.run_elsewhere()
    message = Message()
    assert h.deliver(message) == "deferred"
    assert message.acks == 0
    assert h.qos.extra == 1
    h.timer.advance(0.6)  # rechecked early: still running
    assert message.acks == 0 and h.qos.extra == 1
    h.store.complete(h.facts(), token)
    h.timer.advance(1.1)
    assert message.acks == 1
    assert h.qos.extra == 0
    assert h.started == []


def test_deferred_copy_runs_when_the_lease_of_a_dead_worker_runs_out(h):
    h.run_elsewhere()
    message = Message()
    assert h.deliver(message) == "deferred"
    h.timer.advance(11)
    assert [m for m, _ in h.started] == [message]
    assert message.acks == 0
    assert h.qos.extra == 0


def test_copy_of_a_delayed_retry_is_deferred_until_the_retry_is_due(h):
    token = h.run_elsewhere()
    h.store.fail(h.facts(), token, LIMITS, retryable=True)
    message = Message()
    assert h.deliver(message) == "deferred"
    h.timer.advance(0.9)
    assert h.started == []
    h.timer.advance(0.2)
    assert [m for m, _ in h.started] == [message]


def test_expired_message_is_acked_without_asking_redis(h):
    message = Message(headers={"x-beetle-expires-at": NOW_MS // 1000 - 1})
    assert h.deliver(message) == "expired"
    assert message.acks == 1
    assert h.store.round_trips == 0
    assert h.started == []


def test_message_without_message_id_is_dead_lettered_and_acked(h):
    message = Message(message_id=None)
    assert h.deliver(message) == "bad_input"
    assert message.acks == 1
    assert [(m, q, reason) for m, q, reason, _ in h.dead] == [(message, "jobs", "no_message_id")]


def test_undecodable_body_is_dead_lettered_and_acked(h):
    message = Message(decodes=False)
    assert h.deliver(message) == "bad_input"
    assert message.acks == 1
    assert h.dead[0][2] == "undecodable"
    assert "not json" in h.dead[0][3]


def test_redis_down_parks_deliveries_without_widening_prefetch_and_resumes_when_it_answers(h):
    h.store.down = True
    h.redis_answers = False
    first, second = Message("m1"), Message("m2")
    assert h.deliver(first) == "parked"
    reads = h.store.round_trips
    assert h.deliver(second) == "parked"
    assert h.store.round_trips == reads, "no more Redis calls while paused"
    assert h.gate.paused
    assert h.qos.extra == 0
    h.timer.advance(3)
    assert h.started == [] and first.acks == 0
    h.store.down = False
    h.redis_answers = True
    h.timer.advance(1)
    assert not h.gate.paused
    assert sorted(m.properties["message_id"] for m, _ in h.started) == ["m1", "m2"]


def test_reset_forgets_held_deliveries_so_stale_timers_do_nothing(h):
    h.run_elsewhere()
    message = Message()
    h.deliver(message)
    h.gate.reset()
    h.timer.advance(11)
    assert h.started == []
    assert message.acks == 0


def test_deferred_copy_whose_broker_went_away_is_forgotten(h):
    h.run_elsewhere()
    message = Message()
    h.deliver(message)
    message.channel.is_open = False
    h.timer.advance(11)
    assert h.started == []
    assert h.gate.stats["forgotten"] == 1


def test_the_gate_tells_the_pool_its_facts_through_a_header(h):
    message = Message(headers={"x-beetle-expires-at": NOW_MS // 1000 + 60})
    h.deliver(message)
    facts = facts_from_headers(message.headers[FACTS_HEADER])
    assert facts == MessageFacts("jobs", "m1", NOW_MS + 60_000)


def test_message_without_expiry_header_expires_a_default_ttl_after_its_publication():
    facts = message_facts("q", "id", {"x-beetle-published-at": NOW_MS}, 5_000, NOW_MS + 1)
    assert facts.expires_at_ms == NOW_MS + 5_000
    facts = message_facts("q", "id", {}, 5_000, NOW_MS)
    assert facts.expires_at_ms == NOW_MS + 5_000


def test_copy_of_a_run_that_completed_here_is_dropped_without_reading_redis(h):
    first, second, late = Message(), Message(), Message()
    h.deliver(first)
    h.deliver(second)
    first.headers[FACTS_HEADER]["completed"] = True  # what BeetleRequest marks on success
    _, done = h.started[0]
    done.finished()
    h.timer.advance()
    h.deliver(late)
    assert second.acks == 1 and late.acks == 1
    assert h.store.round_trips == 1, "only the first copy's gate read"
    assert len(h.started) == 1


def test_a_run_that_did_not_complete_here_leaves_the_decision_to_redis(h):
    first, second = Message(), Message()
    h.deliver(first)
    h.deliver(second)
    token = h.store.claim(h.facts(), LIMITS, "me:1").token
    h.store.fail(h.facts(), token, LIMITS, retryable=True)
    _, done = h.started[0]
    done.finished()
    h.timer.advance()
    assert second.acks == 0
    assert h.gate.stats["deferred"] == 1


def test_a_soft_time_limit_does_not_stop_a_completion_from_being_stored():
    from billiard.exceptions import SoftTimeLimitExceeded

    from celery_beetle.store.health import call_until_stored

    calls = []

    def operation(number: int) -> str:
        calls.append(number)
        if number == 0:
            raise SoftTimeLimitExceeded()  # fired while the completion was being written
        return "stored"

    assert call_until_stored(operation, "a completion", sleep=lambda _: None) == "stored"
    assert calls == [0, 1]


# Pipelined reads: the gate goes on from each read's reply


class ManualReads:
    """Gate reads answered when the test says so, from the store (as Redis would)."""

    def __init__(self, store: FakeStore) -> None:
        self.store = store
        self.asked: list[tuple[MessageFacts, Callable[..., None]]] = []
        self.closed = 0

    def read(self, facts: MessageFacts, callback: Callable[..., None]) -> None:
        self.asked.append((facts, callback))

    def answer(self, error: BaseException | None = None) -> None:
        asked, self.asked = self.asked, []
        for facts, callback in asked:
            if error is not None:
                callback(None, error)
            else:
                callback(self.store.peek(facts.queue, facts.message_id), None)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def pipelined(h: Harness) -> ManualReads:
    reads = ManualReads(h.store)
    h.rebuild(reads=reads)
    return reads


def test_a_delivery_goes_on_when_its_read_is_answered_and_its_twin_waits_without_a_read(
    h, pipelined
):
    first, second = Message(broker="rabbit-a"), Message(broker="rabbit-b")
    assert h.deliver(first) == "reading"
    assert h.deliver(second) == "waiting"
    assert len(pipelined.asked) == 1 and h.started == []
    pipelined.answer()
    assert [m for m, _ in h.started] == [first]
    _, done = h.started[0]
    first.headers[FACTS_HEADER]["completed"] = True
    done.finished()
    assert second.acks == 1 and pipelined.asked == []


def test_twins_of_a_duplicate_found_by_a_read_are_dropped_without_another(h, pipelined):
    h.store.complete(h.facts(), h.run_elsewhere())
    first, second = Message(), Message()
    h.deliver(first)
    h.deliver(second)
    pipelined.answer()
    assert (first.acks, second.acks) == (1, 1)
    assert pipelined.asked == [] and h.started == []


def test_a_failed_read_parks_the_delivery_and_its_twin_until_redis_answers(h, pipelined):
    first, second = Message(), Message()
    h.deliver(first)
    h.deliver(second)
    h.redis_answers = False
    pipelined.answer(RedisConnectionError("connection refused"))
    assert h.gate.paused and h.gate.held == 2
    h.redis_answers = True
    h.timer.advance(1.1)
    assert not h.gate.paused and len(pipelined.asked) == 1  # the twin waits for this read
    pipelined.answer()
    assert [m for m, _ in h.started] == [first]


def test_a_reply_after_a_consumer_restart_is_ignored(h, pipelined):
    message = Message()
    h.deliver(message)
    h.gate.reset()
    assert pipelined.closed == 1
    pipelined.answer()
    assert h.started == [] and message.acks == 0


# Hardening: nothing raises out of the gate, nothing is acked unstored


class RejectingMessage(Message):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requeued = 0

    def reject(self, requeue: bool = False) -> None:
        assert requeue
        self.requeued += 1


@pytest.mark.parametrize(
    "headers",
    [
        {"x-beetle-expires-at": "inf"},
        {"x-beetle-expires-at": float("inf")},
        {"x-beetle-expires-at": "1e309"},
        {"x-beetle-expires-at": float("nan")},
        {"x-beetle-expires-at": "abc"},
        {"x-beetle-expires-at": [1, 2]},
        {"x-beetle-expires-at": True},
        {"x-beetle-published-at": "inf"},
        {"x-beetle-flags": "zz"},
    ],
)
def test_a_header_no_publisher_writes_is_dead_lettered_as_invalid_and_acked(h, headers):
    message = Message(headers=headers)
    assert h.deliver(message) == "bad_input"
    assert message.acks == 1 and h.started == []
    (_, _, reason, detail), *_ = h.dead
    name = next(iter(headers))
    assert reason == "invalid_header" and name in detail


def test_an_over_long_message_id_is_dead_lettered_as_invalid(h):
    message = Message(message_id="x" * 100_000)
    assert h.deliver(message) == "bad_input"
    assert h.dead[0][2] == "invalid_header" and len(h.dead[0][3]) < 300


def test_a_far_future_expiry_is_cut_to_the_longest_message_life(h):
    from celery_beetle.worker.facts import MAX_MESSAGE_LIFE_MS

    message = Message(headers={"x-beetle-expires-at": 1e17})
    assert h.deliver(message) == "run"
    facts = facts_from_headers(message.headers[FACTS_HEADER])
    assert facts is not None and facts.expires_at_ms == NOW_MS + MAX_MESSAGE_LIFE_MS


class RecordingTracer:
    enabled = True

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def emit(self, event: str, message_id: str, **fields: Any) -> None:
        self.events.append((event, message_id, fields))


def test_bad_input_writes_a_dead_lettered_event_so_a_replay_of_it_is_not_counted_lost(h):
    # the explorer's seed 5071: a bad message replayed from the dead letters and found bad
    # again left no evidence of its second dead letter; the audit counted it lost
    h.rebuild(tracer=(tracer := RecordingTracer()))
    message = Message(message_id="bad-1", decodes=False)
    assert h.deliver(message) == "bad_input"
    dead = [(mid, f["queue"], f["detail"]) for ev, mid, f in tracer.events if ev == "dead_lettered"]
    assert dead == [("bad-1", "jobs", {"reason": "undecodable"})]


def test_bad_input_whose_dead_letter_fails_is_handed_back_not_acked(h):
    def refuse(*args: Any) -> None:
        raise ConnectionResetError("broker gone")

    h.rebuild(dead_letter=refuse)
    message = RejectingMessage(decodes=False)
    assert h.deliver(message) == "handed_back"
    assert message.acks == 0 and message.requeued == 0
    h.timer.advance(0.5)
    assert message.requeued == 1 and message.acks == 0


def test_bad_input_another_worker_is_dead_lettering_is_handed_back_after_its_lease(h):
    h.rebuild(dead_letter=lambda *args: 7.0)
    message = RejectingMessage(decodes=False)
    assert h.deliver(message) == "handed_back"
    h.timer.advance(6.9)
    assert message.requeued == 0
    h.timer.advance(0.2)
    assert (message.requeued, message.acks) == (1, 0)


class BrokenStore(FakeStore):
    """A store whose reads fail with ``error``."""

    error: BaseException | None = None

    def peek(self, queue: str, message_id: str) -> Any:
        if self.error is not None:
            raise self.error
        return super().peek(queue, message_id)


def test_a_store_out_of_memory_pauses_the_gate_like_an_unreachable_one(h):
    from redis.exceptions import OutOfMemoryError

    h.rebuild(store=(store := BrokenStore(clock=h.clock)))
    store.error = OutOfMemoryError("OOM command not allowed")
    message = RejectingMessage()
    assert h.deliver(message) == "parked"
    assert h.gate.paused and message.acks == 0


def test_an_error_nobody_foresaw_hands_the_delivery_back_with_a_growing_backoff(h):
    from redis.exceptions import ResponseError

    h.rebuild(store=(store := BrokenStore(clock=h.clock)))
    store.error = ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
    message = RejectingMessage()
    assert h.deliver(message) == "handed_back"
    assert not h.gate.paused
    h.timer.advance(0.5)
    assert message.requeued == 1
    assert h.deliver(message) == "handed_back"
    h.timer.advance(0.5)
    assert message.requeued == 1, "the second hand-back of the same message waits longer"
    h.timer.advance(0.5)
    assert message.requeued == 2 and message.acks == 0


def test_a_gate_bug_never_raises_out_and_hands_the_delivery_back(h):
    def broken(message: Any) -> str:
        raise KeyError("a bug")

    h.gate.queue_of = broken
    message = RejectingMessage()
    assert h.deliver(message) == "handed_back"
    h.timer.advance(1.0)
    assert (message.requeued, message.acks) == (1, 0)


def test_deferred_copies_past_the_bound_stop_widening_the_prefetch_window(h):
    h.rebuild(max_deferred=2)
    for n in range(4):
        h.run_elsewhere(f"m{n}")
        assert h.deliver(Message(message_id=f"m{n}")) == "deferred"
    assert h.qos.extra == 2 and h.gate.holding.deferred == 4
    assert h.gate.stats["deferred_past_bound"] == 2
    h.timer.advance(11)  # every lease ran out: they run, and the window is back
    assert h.qos.extra == 0 and h.gate.holding.deferred == 0


def test_deferred_bytes_are_bounded_too(h):
    h.rebuild(max_deferred_bytes=10)
    h.run_elsewhere("m1")
    message = Message(message_id="m1")
    message.body = b"x" * 11  # type: ignore[attr-defined]
    assert h.deliver(message) == "deferred"
    assert h.qos.extra == 0 and h.gate.holding.deferred_bytes == 11


def test_a_run_the_pool_handed_back_is_requeued_after_a_backoff_and_its_claim_released(h):
    message = Message()
    assert h.deliver(message) == "run"
    _, done = h.started[0]
    claim = h.store.claim(h.facts(), LIMITS, "run-1")  # applied, its reply lost
    rejected: list[int] = []
    mark = {"delay_s": 2.0, "store": True, "owner": "run-1", "reason": "claim not stored"}
    done.handed_back(mark, lambda: rejected.append(1))
    assert h.gate.paused and rejected == []
    h.timer.advance(1.0)  # the probe succeeds: the claim is released by its owner first
    assert not h.gate.paused
    state = h.store.peek("jobs", "m1")
    assert state is not None and state.status.value == "p" and state.attempts == 0
    assert claim.token == state.token
    h.timer.advance(1.0)
    assert rejected == [1]


def test_an_unknown_task_is_handed_back_within_its_grace_then_dead_lettered(h):
    h.rebuild(unknown_task_grace_ms=10_000)
    message = RejectingMessage()
    assert h.gate.unknown_task(message, "t.new", "NotRegistered") == "handed_back"
    h.timer.advance(0.5)
    assert (message.requeued, message.acks, h.dead) == (1, 0, [])
    h.timer.advance(10)
    assert h.gate.unknown_task(message, "t.new", "NotRegistered") == "bad_input"
    assert message.acks == 1 and h.dead[0][2] == "unknown_task"


# -- the transport's delivery filter: a twin held before kombu makes a Message of it --------


class RawChannel:
    is_open = True
    connection = object()

    def __init__(self) -> None:
        self.acked: list[int] = []
        self.rejected: list[tuple[int, bool]] = []

    def basic_ack(self, tag: int) -> None:
        self.acked.append(tag)

    def basic_reject(self, tag: int, requeue: bool = True) -> None:
        self.rejected.append((tag, requeue))


class Raw:
    """A py-amqp message as the transport's filter sees it."""

    def __init__(self, message_id: str = "m1", tag: int = 7) -> None:
        self.properties = {
            "message_id": message_id,
            "application_headers": {"id": "task-1", "task": "t.beetle"},
        }
        self.delivery_info = {"routing_key": "jobs", "beetle_broker": "rabbit-b"}
        self.delivery_tag = tag
        self.channel = RawChannel()
        self.body = b"[[], {}, {}]"


def hold(h: Harness, raw: Raw) -> tuple[bool, list[Raw]]:
    delivered: list[Raw] = []
    return h.gate.hold_twin(raw, "t.beetle", delivered.append), delivered


def test_a_twin_of_a_message_running_here_is_held_raw_and_acked_when_its_run_completes(
    h, pipelined
):
    first = Message()
    assert h.deliver(first) == "reading"
    raw = Raw()
    held, delivered = hold(h, raw)
    assert held and delivered == [] and len(pipelined.asked) == 1
    pipelined.answer()
    _, done = h.started[0]
    first.headers[FACTS_HEADER]["completed"] = True
    done.finished()
    assert raw.channel.acked == [7] and delivered == []
    assert h.gate.stats["twins_held"] == 1 and h.gate.stats["duplicate"] == 1
    assert pipelined.asked == [], "no Redis call for the twin"


def test_a_held_twin_goes_on_through_the_gate_when_its_run_ends_without_completing(h):
    assert h.deliver(Message()) == "run"
    raw = Raw()
    held, delivered = hold(h, raw)
    assert held
    _, done = h.started[0]
    done.finished()  # not completed: a retry, a failure, a lease taken over
    h.timer.advance()
    assert delivered == [raw] and raw.channel.acked == []


def test_a_twin_of_a_message_completed_here_a_moment_ago_is_acked_at_once(h):
    first = Message()
    h.deliver(first)
    _, done = h.started[0]
    first.headers[FACTS_HEADER]["completed"] = True
    done.finished()
    raw = Raw(tag=9)
    held, delivered = hold(h, raw)
    assert held and raw.channel.acked == [9] and delivered == []


def test_a_copy_of_a_message_not_running_here_is_left_to_the_gate(h):
    assert hold(h, Raw()) == (False, [])
    assert hold(h, Raw(message_id="")) == (False, [])
    h.gate.outage.pause(RuntimeError("connection refused"))
    h.deliver(Message())
    assert hold(h, Raw()) == (False, [])


def test_held_twins_are_forgotten_when_the_consumer_restarts(h):
    h.deliver(Message())
    raw = Raw()
    held, delivered = hold(h, raw)
    assert held
    h.gate.reset()
    h.timer.advance(60)
    assert raw.channel.acked == [] and delivered == [], "its broker delivers it again"


def test_a_held_twin_whose_channel_was_reopened_is_neither_acked_nor_sent_on(h):
    # a reopened channel counts delivery tags from 1 again: the old tag may name another
    # message, and the broker gave this one back anyway
    first = Message()
    h.deliver(first)
    raw, other = Raw(tag=3), Raw(message_id="m2", tag=4)
    assert hold(h, raw)[0]
    raw.channel.beetle_incarnation = 1
    _, done = h.started[0]
    first.headers[FACTS_HEADER]["completed"] = True
    done.finished()
    assert raw.channel.acked == []
    h.deliver(Message(message_id="m2"))
    held, delivered = hold(h, other)
    assert held
    other.channel.beetle_incarnation = 1
    _, done = h.started[1]
    done.finished()  # not completed: the twin would go on through the gate
    h.timer.advance()
    assert delivered == [] and other.channel.rejected == []


def test_a_held_twin_sent_on_is_traced_and_counted_as_delivered_once(h):
    h.rebuild(tracer=(tracer := RecordingTracer()))
    h.deliver(Message())
    raw = Raw()
    held, delivered = hold(h, raw)
    assert held
    _, done = h.started[0]
    done.finished()  # not completed: the twin goes on through Celery and the gate
    h.timer.advance()
    assert delivered == [raw]
    again = Message(broker="rabbit-b")
    again.delivery_info = raw.delivery_info  # kombu's Message shares the raw delivery's dict
    h.deliver(again)
    assert [ev for ev, _, _ in tracer.events].count("delivered") == 2, "one per copy"
    assert h.gate.stats["delivered"] == 2
