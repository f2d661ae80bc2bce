"""The gate's own claim and the completion it stores before the ack (FakeStore, no server).

With pipelined calls the gate claims a delivery in its batch instead of reading its record;
the pool then runs on that lease and the gate stores the completion before it acks. The
calls here answer when the test says a loop pass ended (``flush``), as the batch would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from celery_beetle.store.fake import FakeStore
from celery_beetle.store.outcome import Limits
from celery_beetle.store.state import MessageFacts, Status
from celery_beetle.testing.waiting import wait_until
from celery_beetle.worker.facts import CLAIM_MARK, COMPLETED_MARK, FACTS_HEADER, GateClaim
from celery_beetle.worker.gate import DeliveryGate
from kombu_beetle.trace import TraceWriter
from tests.unit.test_gate import NOW_MS, Clock, Message, QoS, Timer

LIMITS = Limits(lease_timeout_ms=10_000, attempts=3, exceptions=2, delay_ms=1_000)


class Calls:
    """The gate's pipelined calls on a FakeStore: queued, answered by ``flush()``."""

    def __init__(self, store: FakeStore) -> None:
        self.store = store
        self.queued: list[tuple[Callable[[], Any], Callable[[Any, Any], None]]] = []
        self.failing: BaseException | None = None
        self.kinds: list[str] = []
        self.after_batch: Callable[[], None] = lambda: None
        self.in_batch = False
        #: how many times the gate asked for the queued calls to be written at once
        self.written_now = 0

    def read(self, facts: MessageFacts, callback: Any) -> None:
        self.kinds.append("read")
        self.queued.append((lambda: self.store.peek(facts.scope, facts.message_id), callback))

    def claim(
        self, facts: MessageFacts, limits: Limits, owner: str, callback: Any, reserve_ms: int = 0
    ) -> None:
        self.kinds.append("claim")
        self.queued.append((lambda: self.store.claim(facts, limits, owner, reserve_ms), callback))

    def renew(self, facts: MessageFacts, token: int, reserve_ms: int, callback: Any) -> None:
        self.kinds.append("renew")
        self.queued.append(
            (lambda: self.store.extend(facts, token, reserve_ms, reservation=True), callback)
        )

    def complete(self, facts: MessageFacts, token: int, callback: Any) -> None:
        self.kinds.append("complete")
        self.queued.append((lambda: self.store.complete(facts, token), callback))

    def close(self) -> None:
        self.flush(RedisConnectionError("closed"))

    def write_now(self) -> None:
        self.written_now += 1

    def flush(self, error: BaseException | None = None) -> None:
        queued, self.queued = self.queued, []
        self.in_batch = True
        for call, callback in queued:
            error = error or self.failing
            if error is not None:
                callback(None, error)
                continue
            try:
                value = call()
            except Exception as exc:  # an error reply: for this call only
                callback(None, exc)
            else:
                callback(value, None)
        self.in_batch = False
        self.after_batch()


class Harness:
    def __init__(self, tracer: Any = None) -> None:
        self.clock = Clock()
        self.timer = Timer(self.clock)
        self.store = FakeStore(clock=self.clock)
        self.calls = Calls(self.store)
        self.started: list[tuple[Message, Callable[..., None]]] = []
        self.acked: list[Message] = []
        self.gate = DeliveryGate(
            store=self.store,
            call_later=self.timer,
            qos=lambda: QoS(),
            dead_letter=lambda *args: None,
            queue_of=lambda message: message.delivery_info["routing_key"],
            probe=lambda: True,
            clock=self.clock,
            reads=self.calls,
            claims_for=lambda message, name: LIMITS,
            worker="celery@here",
            **({"tracer": tracer} if tracer is not None else {}),
        )

    def deliver(self, message: Message) -> str:
        return self.gate.handle(
            message, "t.beetle", lambda done: self.started.append((message, done))
        )

    def succeed(self, message: Message, done: Callable[..., None]) -> bool:
        """What the request does after a successful run: mark it, then ack through the
        strategy's wrapper (as the bootstep's ``on_ack``); True if the ack waits."""
        message.headers[FACTS_HEADER][COMPLETED_MARK] = True

        def acked() -> None:
            message.ack()
            self.acked.append(message)
            done.finished()

        if self.gate.complete_before_ack(message, acked):
            return True
        acked()
        return False

    def run_to_success(self, message: Message) -> None:
        """Deliver ``message`` alone, let the gate claim it and its run succeed; its
        completion then waits for the next batch."""
        self.deliver(message)
        self.calls.flush()
        ((started, done),) = self.started
        self.succeed(started, done)

    def facts(self, message_id: str = "m1") -> MessageFacts:
        return MessageFacts("jobs", message_id, NOW_MS + 86_400_000)


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_the_gate_claims_and_the_run_carries_the_lease_to_the_pool(h):
    first = Message()
    assert h.deliver(first) == "reading"
    assert h.calls.kinds == ["claim"]
    h.calls.flush()
    ((message, _),) = h.started
    claim = GateClaim.from_mark(message.headers[FACTS_HEADER][CLAIM_MARK])
    assert claim is not None and claim.token == 1 and claim.attempt == 1
    assert claim.deadline_ms == NOW_MS + LIMITS.lease_timeout_ms
    record = h.store.peek("jobs", "m1")
    assert record.status is Status.RUNNING and record.owner == claim.owner


def test_the_ack_waits_for_the_completion_and_the_twin_is_dropped_without_a_call(h):
    first, twin = Message(broker="a"), Message(broker="b")
    h.deliver(first)
    h.deliver(twin)  # waits for its twin's claim: no call of its own
    h.calls.flush()
    ((message, done),) = h.started
    assert h.succeed(message, done)
    assert first.acks == 0, "no ack before the completion is stored"
    h.calls.flush()
    assert h.store.peek("jobs", "m1").status is Status.COMPLETED
    assert first.acks == 1 and twin.acks == 1
    assert h.calls.kinds == ["claim", "complete"]
    assert h.gate.stats["completed"] == 1 and h.gate.stats["known_completed"] == 1


def test_a_completion_redis_refuses_is_retried_and_the_message_is_not_acked_meanwhile(h):
    first = Message()
    h.run_to_success(first)
    h.calls.failing = RedisConnectionError("connection refused")
    h.calls.flush()
    assert first.acks == 0 and h.gate.paused, "the gate stops taking messages meanwhile"
    for _ in range(3):
        h.timer.advance(5)
        h.calls.flush()
    assert first.acks == 0
    h.calls.failing = None
    h.timer.advance(5)
    h.calls.flush()
    assert first.acks == 1
    assert h.store.peek("jobs", "m1").status is Status.COMPLETED


def test_a_completion_waiting_out_a_long_outage_is_tried_again_every_half_second(h):
    """Seed 112010: Redis cut off, then refusing writes, for 5 s of a 6 s lease; the gate's
    retries had backed off to 3.2 s, so the completion came after the lease and the message
    ran again. Once Redis takes writes again, the completion is stored within 0.5 s."""
    first = Message()
    h.run_to_success(first)
    h.calls.failing = RedisConnectionError("connection refused")
    h.calls.flush()
    for _ in range(50):  # 5 s of failed tries
        h.timer.advance(0.1)
        h.calls.flush()
    assert first.acks == 0
    h.calls.failing = None
    h.timer.advance(0.5)
    h.calls.flush()
    assert first.acks == 1
    assert h.store.peek("jobs", "m1").status is Status.COMPLETED


def test_a_shutdown_stores_the_completions_owed_and_acks_each_once(h):
    first = Message()
    h.run_to_success(first)
    h.calls.failing = RedisConnectionError("connection refused")
    h.calls.flush()  # owed: the retry waits on a timer the stopping worker no longer runs
    assert h.gate.store_owed(wait_s=1.0) == (1, 1)
    assert first.acks == 1
    assert h.store.peek("jobs", "m1").status is Status.COMPLETED
    h.calls.failing = None
    h.timer.advance(5)  # the retry the event loop had planned finds nothing owed
    h.calls.flush()
    assert first.acks == 1 and h.calls.kinds == ["claim", "complete"]


def test_during_a_warm_shutdown_a_completion_is_stored_as_it_comes_not_at_the_end(h):
    """Celery closes the consumer, then waits for the pool with the event loop stopped: a
    completion owed meanwhile must not wait for the longest task, past its own lease."""
    first, second = Message(), Message(message_id="m2", headers={"id": "task-2"})
    h.run_to_success(first)  # owed: its batch goes out on a loop that no longer runs
    h.gate.drain_while_stopping()
    assert wait_until(lambda: first.acks == 1, timeout=5)
    assert h.store.peek("jobs", "m1").status is Status.COMPLETED
    h.deliver(second)
    h.calls.flush()  # the claim was answered before the shutdown began
    (_, (started, done)) = h.started
    h.succeed(started, done)  # a task the pool finished during the shutdown
    assert wait_until(lambda: second.acks == 1, timeout=5)
    assert h.gate.store_owed(wait_s=1.0) == (0, 0), "nothing left for the end"
    h.calls.flush()  # the loop's own sends, if it ever ran them, find nothing owed
    assert (first.acks, second.acks) == (1, 1)


def test_a_shutdown_releases_the_claims_sent_without_an_answer(h):
    """The probe that would release them once Redis answered stops with the event loop: a
    claim Redis applied while its reply was lost would hold the message for a whole lease."""
    assert h.store.claim(h.facts(), LIMITS, "lost-reply").acquired
    h.gate.outage.to_release.append((h.facts(), "lost-reply"))
    assert h.gate.store_owed(wait_s=1.0) == (0, 0)
    assert h.gate.outage.to_release == []
    assert h.store.claim(h.facts(), LIMITS, "next-worker").acquired, "free at once"


def test_a_shutdown_gives_up_on_what_it_cannot_store_within_its_wait_and_acks_nothing(h):
    first = Message()
    h.run_to_success(first)
    h.store.complete = _refused  # type: ignore[method-assign]
    assert h.gate.store_owed(wait_s=0.3) == (0, 1)
    assert first.acks == 0, "never ack what is not stored: the message goes back"
    assert h.gate.store_owed(wait_s=0.3) == (0, 0), "nothing is owed twice"


def _refused(*args: Any) -> Any:
    raise RedisConnectionError("connection refused")


def test_a_completion_refused_after_a_takeover_acks_and_lets_the_twin_look_again(h):
    first, twin = Message(broker="a"), Message(broker="b")
    h.deliver(first)
    h.deliver(twin)
    h.calls.flush()
    ((message, done),) = h.started
    h.clock.ms += LIMITS.lease_timeout_ms + 1  # the lease ran out: another worker took over
    assert h.store.claim(h.facts(), LIMITS, "other").acquired
    h.succeed(message, done)
    h.calls.flush()
    assert first.acks == 1
    assert message.headers[FACTS_HEADER][COMPLETED_MARK] is False
    assert twin.acks == 0, "not a known duplicate: it goes through the gate again"
    h.timer.advance(0)
    h.calls.flush()
    assert h.gate.stats["deferred"] == 1, "the other worker's lease is live"


def test_a_completion_whose_record_a_failover_lost_requeues_its_copy_and_runs_again(h):
    """Seed 113021: the twin was wiped with its broker, then a Redis failover lost the claim
    of the copy left; its completion found no record, and the ack lost the message. With
    no record nobody took it over: the copy goes back to its queue and runs again."""
    first = Message()
    h.deliver(first)
    h.calls.flush()
    ((message, done),) = h.started
    message.headers[FACTS_HEADER][COMPLETED_MARK] = True
    requeued: list[Message] = []

    def requeue() -> None:
        requeued.append(message)
        done.finished()

    assert h.gate.complete_before_ack(message, message.ack, requeue)
    h.store.records.clear()  # the new master lacks the claim the old one acknowledged
    h.calls.flush()
    assert first.acks == 0, "an ack would lose the message: no run holds it"
    assert requeued == [first]
    assert message.headers[FACTS_HEADER][COMPLETED_MARK] is False
    assert h.gate.stats["record_lost"] == 1 and h.gate.stats["lease_lost"] == 0
    h.started.clear()
    h.deliver(first)  # the broker delivers it again: a fresh claim, its body runs again
    h.calls.flush()
    assert len(h.started) == 1


def test_a_completion_refused_without_a_record_acks_where_it_cannot_requeue(h):
    first = Message()
    h.run_to_success(first)
    h.store.records.clear()
    h.calls.flush()
    assert first.acks == 1 and h.gate.stats["lease_lost"] == 1


def test_a_copy_whose_claim_is_locked_elsewhere_is_deferred(h):
    assert h.store.claim(h.facts(), LIMITS, "other").acquired
    h.deliver(Message())
    h.calls.flush()
    assert not h.started and h.gate.stats["deferred"] == 1


def test_a_message_out_of_attempts_goes_to_the_pool_to_publish_its_dead_letter(h):
    for n in range(LIMITS.attempts):
        h.store.claim(h.facts(), LIMITS, f"crashed-{n}")
        h.clock.ms += LIMITS.lease_timeout_ms + 1
    h.deliver(Message())
    h.calls.flush()
    ((message, _),) = h.started
    claim = GateClaim.from_mark(message.headers[FACTS_HEADER][CLAIM_MARK])
    assert claim is not None and claim.dead_letter == "attempts_limit" and not claim.token


def test_a_claim_answered_after_a_consumer_restart_is_released(h):
    h.calls.close = lambda: None  # type: ignore[method-assign]  # the reply is on its way
    h.deliver(Message())
    h.gate.reset()  # the consumer restarts: the delivery cannot be acked any more
    h.calls.flush()
    assert not h.started
    record = h.store.peek("jobs", "m1")
    assert record is not None and record.token == 1, "it was claimed"
    assert record.status is Status.PENDING, "and released: its redelivery need not wait"
    assert record.attempts == 0, "a release gives the attempt back"


def test_a_task_with_an_eta_is_read_and_left_to_the_pool_to_claim(h):
    h.gate.claims_for = lambda message, name: None if message.headers.get("eta") else LIMITS
    h.deliver(Message(headers={"eta": "2030-01-01T00:00:00"}))
    h.calls.flush()
    assert h.calls.kinds == ["read"]
    ((message, _),) = h.started
    assert CLAIM_MARK not in message.headers[FACTS_HEADER]


def test_a_release_redis_refuses_for_another_reason_does_not_hold_up_the_others(h):
    from redis.exceptions import ResponseError

    good = h.facts("good")
    assert h.store.claim(good, LIMITS, "owner-good").acquired
    real_release = h.store.release

    def release(facts: MessageFacts, token: int, owner: str = "") -> Any:
        if facts.message_id == "bad":
            raise ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
        return real_release(facts, token, owner)

    h.store.release = release  # type: ignore[method-assign]
    h.gate.outage.release_later(h.facts("bad"), "owner-bad")
    h.gate.outage.release_later(good, "owner-good")
    assert h.store.peek("jobs", "good").status is Status.PENDING
    assert not h.gate.outage.to_release


def _gate_tracer(directory: Path) -> TraceWriter:
    """A gate tracer whose lines are written only when the gate says (per batch)."""
    return TraceWriter(directory, role="gate", defer_sync=True, flush_interval_s=3600)


def _traced(directory: Path) -> list[dict]:
    """Every trace line written so far under ``directory``, parsed."""
    return [json.loads(line) for path in directory.glob("*.jsonl")
            for line in path.read_text().splitlines()]  # fmt: skip


def test_a_completion_is_traced_before_its_ack_and_written_once_per_batch(tmp_path):
    """The gate's ``completed`` event is in the file before the message is acked: a worker
    killed between the two must not leave a trace that reads "lost"."""
    tracer = _gate_tracer(tmp_path)
    h = Harness(tracer=tracer)
    messages = [Message(message_id=f"m{n}") for n in range(3)]
    for message in messages:
        h.deliver(message)
    h.calls.flush()
    written_at_ack: list[list[str]] = []

    def events() -> list[str]:
        return [line["event"] for line in _traced(tmp_path)]

    for message, done in h.started:
        message.ack = lambda: written_at_ack.append(events())  # type: ignore[method-assign]
        assert h.succeed(message, done)
    assert h.acked == [] and events().count("completed") == 0  # not stored yet
    h.calls.flush()  # one batch stores the three completions
    assert len(h.acked) == 3
    assert all(seen.count("completed") == 3 for seen in written_at_ack)


def test_a_copy_dropped_as_completed_is_traced_before_its_ack(tmp_path):
    """A redelivered copy dropped because the store says "completed" is the audit's evidence
    when the run's own ``completed`` event died with its worker: written before the ack."""
    tracer = _gate_tracer(tmp_path)
    tracer.sync_events = frozenset({"completed", "duplicate"})
    h = Harness(tracer=tracer)
    facts = h.facts()
    claim = h.store.claim(facts, LIMITS, "celery@elsewhere")
    assert h.store.complete(facts, claim.token).ok
    copy = Message()
    seen_at_ack: list[str] = []
    copy.ack = lambda: seen_at_ack.extend(  # type: ignore[method-assign]
        line["event"] for line in _traced(tmp_path)
    )
    h.deliver(copy)
    h.calls.flush()
    assert seen_at_ack == ["delivered", "duplicate"]


def test_a_copy_that_expires_before_its_claim_is_answered_is_traced_before_its_ack(tmp_path):
    tracer = _gate_tracer(tmp_path)
    tracer.sync_events = frozenset({"completed", "duplicate", "expired"})
    h = Harness(tracer=tracer)
    copy = Message()
    seen_at_ack: list[str] = []
    copy.ack = lambda: seen_at_ack.extend(  # type: ignore[method-assign]
        line["event"] for line in _traced(tmp_path)
    )
    h.deliver(copy)
    h.clock.ms += 86_400_001  # past the message's TTL before Redis answers the claim
    h.calls.flush()
    assert seen_at_ack == ["delivered", "expired"]
    assert h.gate.stats["expired"] == 1


def test_in_a_batch_only_the_stored_completions_are_acked_after_their_events(tmp_path):
    """One completion of the batch is stored, the other gets an error reply: the first is
    acked after its ``completed`` event is written; the second is neither traced nor acked
    until Redis takes it."""
    tracer = _gate_tracer(tmp_path)
    h = Harness(tracer=tracer)
    stored, refused = Message(message_id="m1"), Message(message_id="m2")
    for message in (stored, refused):
        h.deliver(message)
    h.calls.flush()
    complete = h.store.complete

    def refuse_m2(facts, token):
        if facts.message_id == "m2":
            raise ResponseError("OOM command not allowed when used memory > 'maxmemory'")
        return complete(facts, token)

    h.store.complete = refuse_m2  # type: ignore[method-assign]
    for message, done in h.started:
        assert h.succeed(message, done)
    h.calls.flush()

    def completed() -> list[str]:
        return [line["message_id"] for line in _traced(tmp_path) if line["event"] == "completed"]

    assert (stored.acks, refused.acks) == (1, 0)
    assert completed() == ["m1"]
    assert h.store.peek("jobs", "m2").status is Status.RUNNING
    h.store.complete = complete  # type: ignore[method-assign]
    h.timer.advance(5)
    h.calls.flush()
    assert refused.acks == 1 and completed() == ["m1", "m2"]


def test_an_ack_that_fails_after_the_batch_does_not_hold_back_the_others(tmp_path):
    """The channel of one copy closed meanwhile: its ack raises (it comes back, and its
    stored completion drops it then); the batch's other acks are still made."""
    tracer = _gate_tracer(tmp_path)
    h = Harness(tracer=tracer)
    closed, fine = Message(message_id="m1"), Message(message_id="m2")
    for message in (closed, fine):
        h.deliver(message)
    h.calls.flush()

    def channel_gone() -> None:
        raise ConnectionResetError("channel closed")

    closed.ack = channel_gone  # type: ignore[method-assign]
    for message, done in h.started:
        assert h.succeed(message, done)
    h.calls.flush()
    assert fine.acks == 1
    assert h.store.peek("jobs", "m1").status is Status.COMPLETED


def test_the_gate_holds_a_reservation_that_counts_no_attempt_until_the_body_begins(h):
    first = Message()
    h.deliver(first)
    h.calls.flush()
    record = h.store.peek("jobs", "m1")
    assert (record.reserved, record.attempts) == (True, 0)


def test_a_reservation_is_renewed_while_its_delivery_waits_and_no_longer_once_it_ran(h):
    long_lease = Limits(lease_timeout_ms=60_000, attempts=1)
    h.gate.claims_for = lambda message, name: long_lease
    first = Message()
    h.deliver(first)
    h.calls.flush()
    ((message, done),) = h.started
    token = GateClaim.from_mark(message.headers[FACTS_HEADER][CLAIM_MARK]).token
    for _ in range(4):  # waits in the pool's queue for 4 renewals: the reservation holds
        h.timer.advance(10 / 3 + 0.01)
        h.calls.flush()
        record = h.store.peek("jobs", "m1")
        assert record.reserved and record.lease_deadline_ms > h.clock.ms + 6_000
    assert h.calls.kinds.count("renew") == 4
    started = h.store.start(h.facts(), token, long_lease)  # the pool process takes it
    h.timer.advance(10 / 3 + 0.01)
    h.calls.flush()
    assert h.store.peek("jobs", "m1").lease_deadline_ms == started.lease_deadline_ms
    h.timer.advance(10)  # its body began: no more renewals
    h.calls.flush()
    assert h.calls.kinds.count("renew") == 5
    assert h.succeed(message, done)
    h.calls.flush()
    assert first.acks == 1 and h.store.peek("jobs", "m1").status is Status.COMPLETED


def test_a_reservation_is_not_renewed_after_its_worker_let_it_go(h):
    first = Message()
    h.deliver(first)
    h.calls.flush()
    h.gate.reset()  # the consumer restarts: what it held is redelivered elsewhere
    h.timer.advance(20)
    h.calls.flush()
    assert "renew" not in h.calls.kinds
    assert h.store.claim(h.facts(), LIMITS, "another", 10_000).acquired  # ran out: free


# -- a prefork pool: fresh deliveries claimed in full as a process comes free -----------------


class Pool:
    """The prefork pool as the gate sees it: how many processes are free, and which tasks
    are claimed in full for one."""

    def __init__(self, free: int, rate_limited: frozenset[str] = frozenset()) -> None:
        self.free = free
        self.rate_limited = rate_limited

    def __call__(self) -> int:
        return self.free

    def takes(self, task_name: str) -> bool:
        return task_name not in self.rate_limited


def test_a_fresh_delivery_is_claimed_in_full_for_a_free_process_and_its_twin_waits(h):
    h.gate.pool_free = Pool(1)
    first, twin = Message(broker="a"), Message(broker="b")
    assert h.deliver(first) == "reading"
    assert h.deliver(twin) == "waiting"
    assert h.calls.kinds == ["claim"], "one call: the claim, in the gate's batch"
    h.calls.flush()
    ((message, done),) = h.started
    claim = GateClaim.from_mark(message.headers[FACTS_HEADER][CLAIM_MARK])
    assert claim is not None and claim.started and claim.sent_at > 0
    assert claim.attempt == 1 and claim.deadline_ms == NOW_MS + LIMITS.lease_timeout_ms
    record = h.store.peek("jobs", "m1")
    assert record.status is Status.RUNNING and record.attempts == 1, "the attempt counts now"
    assert h.succeed(message, done), "the gate stores the completion before the ack"
    h.calls.flush()
    assert first.acks == 1 and twin.acks == 1
    assert h.calls.kinds == ["claim", "complete"]
    assert "renew" not in h.calls.kinds, "a full lease needs no renewals"


def test_fresh_deliveries_wait_unclaimed_in_order_until_a_process_is_free(h):
    pool = h.gate.pool_free = Pool(1)
    a, b, c = (Message(message_id=m) for m in ("a", "b", "c"))
    for message in (a, b, c):
        assert h.deliver(message) == "reading"
    assert h.calls.kinds == ["claim"], "one process free: one claim; the others wait"
    assert h.gate.stats["waiting_for_pool"] == 2
    h.calls.flush()
    pool.free = 0  # the strategy handed "a" to the free process
    h.gate.dispatch.on_tick()
    assert h.calls.kinds == ["claim"]
    pool.free = 2
    h.gate.dispatch.on_tick()
    assert h.calls.written_now == 1, "claimed on the loop's tick: written before it waits"
    h.calls.flush()
    assert [m.properties["message_id"] for m, _ in h.started] == ["a", "b", "c"]
    assert all(
        GateClaim.from_mark(m.headers[FACTS_HEADER][CLAIM_MARK]).started for m, _ in h.started
    )


def test_a_claim_waiting_for_its_reply_keeps_its_process_promised(h):
    h.gate.pool_free = Pool(1)
    h.deliver(Message(message_id="a"))
    h.deliver(Message(message_id="b"))
    h.gate.dispatch.on_tick()  # the reply for "a" has not come: its process is not free
    assert h.calls.kinds == ["claim"]
    h.calls.flush()  # "a" was locked elsewhere, say: no run, the process stays free
    h.gate.dispatch.on_tick()
    assert h.calls.kinds == ["claim", "claim"]


def test_a_delivery_that_waited_while_the_store_went_away_is_parked_not_claimed(h):
    pool = h.gate.pool_free = Pool(0)
    first, twin = Message(broker="a"), Message(broker="b")
    h.deliver(first)
    assert h.deliver(twin) == "waiting", "its twin waits for it, without a call"
    h.gate.outage.pause(RedisConnectionError("refused"))
    pool.free = 1
    h.gate.dispatch.on_tick()
    assert h.calls.kinds == [] and h.gate.held == 2, "both held unacked while paused"


def test_a_consumer_restart_forgets_what_waits_for_a_pool_process(h):
    pool = h.gate.pool_free = Pool(0)
    first = Message()
    h.deliver(first)
    h.gate.reset()
    pool.free = 1
    h.gate.dispatch.on_tick()
    assert h.calls.kinds == [] and first.acks == 0, "left unacked: the broker delivers it again"


def test_a_delivery_whose_message_completed_while_it_waited_is_dropped(h):
    pool = h.gate.pool_free = Pool(1)
    h.deliver(Message(message_id="a", broker="a"))
    late = Message(message_id="b", broker="a")
    h.deliver(late)  # waits behind "a"
    h.calls.flush()
    h.gate.holding.completed.remember(("jobs", "b"))  # its twin completed here meanwhile
    pool.free = 1
    h.gate.dispatch.on_tick()
    assert late.acks == 1 and h.calls.kinds == ["claim"]


def test_a_redelivered_copy_gets_a_reservation_even_with_a_process_free(h):
    h.gate.pool_free = Pool(2)
    again = Message()
    again.delivery_info["redelivered"] = True  # likelier a duplicate: asked first
    assert h.deliver(again) == "reading"
    h.calls.flush()
    ((message, _),) = h.started
    assert not GateClaim.from_mark(message.headers[FACTS_HEADER][CLAIM_MARK]).started
    assert h.store.peek("jobs", "m1").attempts == 0, "a reservation counts no attempt"


def test_a_rate_limited_task_gets_a_reservation_as_celery_holds_it_before_the_pool(h):
    h.gate.pool_free = Pool(2, rate_limited=frozenset({"t.beetle"}))
    assert h.deliver(Message()) == "reading"
    h.calls.flush()
    ((message, _),) = h.started
    assert not GateClaim.from_mark(message.headers[FACTS_HEADER][CLAIM_MARK]).started


def test_a_task_the_gate_would_not_claim_is_read_even_with_a_process_free(h):
    h.gate.pool_free = Pool(2)
    h.gate.claims_for = lambda message, name: None  # an ETA task, a Redis Cluster
    assert h.deliver(Message(headers={"eta": "2030-01-01T00:00:00"})) == "reading"
    assert h.calls.kinds == ["read"]


def test_a_prefork_pool_counts_its_free_processes_and_none_while_stopped():
    from celery.concurrency.prefork import TaskPool

    from celery_beetle.worker.wiring import pool_free_for

    class Consumer:
        pool = TaskPool.__new__(TaskPool)

    reserved: list[object] = []
    Consumer.pool._pool = None  # stopped, or not started yet
    free = pool_free_for(Consumer())
    assert free is not None
    free.reserved = reserved
    assert free() == 0, "no process to take it: what comes waits"
    Consumer.pool._pool = type("Pool", (), {"_processes": 2})()
    assert free() == 2
    reserved.extend(["r1", "r2", "r3"])
    assert free() == 0


def test_a_rate_limited_task_is_not_claimed_in_full_for_a_free_process():
    from celery import Celery

    from celery_beetle.worker.wiring import PreforkFree

    app = Celery("t", set_as_current=False)

    @app.task(name="t.limited", rate_limit="10/s")
    def limited() -> None: ...

    @app.task(name="t.free")
    def free() -> None: ...

    pool = PreforkFree(None, [], app)
    assert not pool.takes("t.limited") and pool.takes("t.free")
