"""Acks made on the event loop go to each broker once per loop pass (kombu_beetle.acks), on
real brokers: every message is settled, a held delivery stays unacked, and a multiple ack
never settles it."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from kombu import Consumer, Queue
from kombu.asynchronous import Hub

from kombu_beetle.brokers import Delivery

COUNT = 40


def _run_until(hub: Hub, predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        hub.run_once()
    return predicate()


def _consumer_on_a_hub(brokers, connect, on_message):  # type: ignore[no-untyped-def]
    conn = connect(brokers.url_for(0, 1), redundant_queues="jobs")
    producer = conn.Producer()
    for i in range(COUNT):
        producer.publish({"n": i}, routing_key="jobs", message_id=f"m{i}", declare=[
            Queue("jobs", durable=True)
        ])  # fmt: skip
    channel = conn.channel()
    consumer = Consumer(channel, [Queue("jobs", durable=True)], callbacks=[on_message])
    consumer.qos(prefetch_count=2 * COUNT)
    consumer.consume()
    hub = Hub()
    conn.transport.register_with_event_loop(conn.connection, hub)
    return conn, hub


def _depths(brokers) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    return [depths.get("jobs", (-1, -1)) for depths in brokers.queue_depths(0, 1)]


#: the queue's (ready, unacked) on each broker: every copy settled
SETTLED = [(0, 0), (0, 0)]


def _depths_when(hub: Hub, brokers, want: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    """The queue's (ready, unacked) on each broker once they are ``want``, running ``hub``
    meanwhile (the brokers' counts lag their acks), or as they are after 20 s."""
    _run_until(hub, lambda: _depths(brokers) == want, 20)
    return _depths(brokers)


def test_acks_on_the_event_loop_settle_every_copy_in_fewer_writes_than_acks(brokers, connect):
    seen: list[Delivery] = []

    def on_message(body: Any, message: Delivery) -> None:
        seen.append(message)
        message.ack()

    conn, hub = _consumer_on_a_hub(brokers, connect, on_message)
    try:
        assert _run_until(hub, lambda: len(seen) == 2 * COUNT, 20), len(seen)
        batcher = conn.connection.ack_batcher
        assert _run_until(hub, lambda: not batcher._pending, 5)
        assert _depths_when(hub, brokers, SETTLED) == SETTLED
        assert batcher.writes > 0 and batcher.frames < 2 * COUNT, (batcher.writes, batcher.frames)
    finally:
        hub.close()


def test_an_ack_that_frees_a_full_prefetch_window_is_written_at_once(brokers, connect):
    conn = connect(brokers.url_for(0))
    producer = conn.Producer()
    for n in range(3):
        producer.publish({"n": n}, routing_key="jobs", declare=[Queue("jobs", durable=True)])
    seen: list[Delivery] = []
    consumer = Consumer(
        conn.channel(), [Queue("jobs", durable=True)], callbacks=[lambda b, m: seen.append(m)]
    )
    consumer.qos(prefetch_count=1)
    consumer.consume()
    hub = Hub()
    conn.transport.register_with_event_loop(conn.connection, hub)
    try:
        for n in range(1, 4):
            assert _run_until(hub, lambda n=n: len(seen) == n, 10), "the next came after the ack"
            assert len(seen) == n, "a window of one: never two at once"
            seen[-1].ack()
            assert not conn.connection.ack_batcher.pending(seen[-1].channel), "written at once"
    finally:
        hub.close()


def test_a_delivery_held_on_the_event_loop_is_not_settled_by_a_multiple_ack(brokers, connect):
    held: list[Delivery] = []
    seen: list[Delivery] = []

    def on_message(body: Any, message: Delivery) -> None:
        seen.append(message)
        if body["n"] == 3:
            held.append(message)  # a countdown task, say: acked much later
        else:
            message.ack()

    _, hub = _consumer_on_a_hub(brokers, connect, on_message)
    try:
        assert _run_until(hub, lambda: len(seen) == 2 * COUNT, 20), len(seen)
        held_copies = [(0, 1), (0, 1)]  # one per broker
        assert _depths_when(hub, brokers, held_copies) == held_copies
        for message in held:
            message.ack()
        assert _depths_when(hub, brokers, SETTLED) == SETTLED
    finally:
        hub.close()


def test_a_drain_on_the_event_loops_thread_writes_the_batch_and_does_not_wait(brokers, connect):
    # Celery's worker begins its event loop with drain_events(timeout=0.1), while the early
    # acks of bodies begun during its start wait as callbacks of that pass (or in the batch,
    # whose timer cannot fire meanwhile); a broker whose prefetch window they fill sends
    # nothing that would end the wait.
    conn = connect(brokers.url_for(0))
    conn.Producer().publish({"n": 1}, routing_key="jobs", declare=[Queue("jobs", durable=True)])
    seen: list[Delivery] = []
    consumer = Consumer(
        conn.channel(), [Queue("jobs", durable=True)], callbacks=[lambda b, m: seen.append(m)]
    )
    consumer.qos(prefetch_count=2)  # a window of one would be full: its ack goes at once
    consumer.consume()
    hub = Hub()
    conn.transport.register_with_event_loop(conn.connection, hub)
    try:
        assert _run_until(hub, lambda: len(seen) == 1, 10)
        seen[0].ack()  # on the loop's thread: into the batch, its timer not run
        assert conn.connection.ack_batcher.pending(seen[0].channel)
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=1.0)
        assert time.monotonic() - began < 0.5  # it handled what had arrived: nothing
        assert brokers.queue_depths(0)[0].get("jobs") == (0, 0)  # (ready, unacked)
    finally:
        hub.close()


def test_an_ack_written_at_once_to_a_broken_connection_fails_its_broker_not_the_caller(
    brokers, connect
):
    """The immediate write of a full window's ack meets a connection that just broke: its
    broker is marked down (the caller's ``ack`` returns), the connection comes back, and
    the broker, which never got the ack, delivers the message again to be settled."""
    conn = connect(brokers.url_for(0, 1), redundant_queues="jobs")
    conn.Producer().publish(
        {"n": 1}, routing_key="jobs", message_id="m1", declare=[Queue("jobs", durable=True)]
    )
    seen: list[Delivery] = []
    consumer = Consumer(
        conn.channel(), [Queue("jobs", durable=True)], callbacks=[lambda b, m: seen.append(m)]
    )
    consumer.qos(prefetch_count=1)  # a window of one: its ack is written at once
    consumer.consume()
    hub = Hub()
    conn.transport.register_with_event_loop(conn.connection, hub)
    try:
        assert _run_until(hub, lambda: len(seen) == 2, 10), "a copy from each broker"
        first = seen[0]
        link = first.channel.beetle_link
        generation = link.generation
        link.conn.transport.sock.shutdown(socket.SHUT_WR)  # the next write raises
        first.ack()  # written at once: the write fails, and it fails the link
        assert not link.alive
        assert not conn.connection.ack_batcher.pending(first.channel)
        seen[1].ack()  # the other broker's copy, on a healthy connection
        assert _run_until(hub, lambda: link.alive and link.generation > generation, 15)
        assert _run_until(hub, lambda: len(seen) == 3, 15), "the unacked copy came back"
        assert seen[2].channel.beetle_link is link
        seen[2].ack()
        assert _depths_when(hub, brokers, SETTLED) == SETTLED
    finally:
        hub.close()
