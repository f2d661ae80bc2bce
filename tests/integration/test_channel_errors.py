"""Channel errors on one broker and the deliveries a consumer holds there.

A declaration a broker refuses (the queue exists there with other arguments, as during
``beetle queues migrate``) goes on a channel of its own and disturbs no consumer. Any
other channel error closes the consuming channel, which gives back what was delivered on
it; py-amqp reopens it under the same id with tags from 1 again, so the deliveries held
from before are settled without a word to the broker (an ack of an old tag is refused and
closes the channel once more: it stopped a worker in ``basic.qos``) and are delivered again.
"""

from __future__ import annotations

import time

import amqp
import pytest
from kombu import Consumer, Queue

from kombu_beetle.brokers import Delivery


def _drain_until(conn, predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            pass
    return predicate()


def _consume_six(brokers, connect):  # type: ignore[no-untyped-def]
    """A consumer on both brokers holding 3 messages x 2 copies, unacked."""
    # each message has a copy on both brokers
    conn = connect(brokers.url_for(0, 1), redundant_queues="jobs")
    held: list[Delivery] = []
    channel = conn.channel()
    consumer = Consumer(
        channel, [Queue("jobs", durable=True)], callbacks=[lambda body, m: held.append(m)]
    )
    consumer.qos(prefetch_count=10)
    consumer.consume()
    producer = conn.Producer()
    for i in range(3):
        producer.publish({"n": i}, routing_key="jobs", message_id=f"m{i}")
    assert _drain_until(conn, lambda: len(held) == 6, 10), len(held)
    return conn, channel, consumer, held


def _settled(brokers) -> bool:  # type: ignore[no-untyped-def]
    return all(depths["jobs"] == (0, 0) for depths in brokers.queue_depths(0, 1))


def test_a_refused_declaration_leaves_the_deliveries_a_consumer_holds_alone(brokers, connect):
    migrated = brokers.nodes[0]
    with migrated.connect(brokers.vhost) as admin:
        admin.channel().queue_declare(
            "migrated", durable=True, arguments={"x-queue-type": "quorum"}
        )
    conn, channel, consumer, held = _consume_six(brokers, connect)

    # refused by the broker that holds "migrated" as a quorum queue: consumed there as it is
    Queue("migrated", durable=True, channel=channel).declare()

    for message in held:
        message.ack()
    consumer.qos(prefetch_count=20)
    _drain_until(conn, lambda: False, 1.0)
    assert len(held) == 6, "nothing was given back, so nothing came again"
    assert {m.channel.beetle_incarnation for m in held} == {0}, "no consuming channel closed"
    assert _settled(brokers)


def test_deliveries_held_across_a_channel_error_are_delivered_again_and_acks_stay_quiet(
    brokers, connect
):
    conn, channel, consumer, held = _consume_six(brokers, connect)
    before = list(held)

    # a 404 on every consuming channel: each is closed, and what it held is given back
    with pytest.raises(amqp.NotFound):
        channel.basic_get("no-such-queue")

    for message in before:
        message.ack()  # the closed channels' deliveries: not sent
    consumer.qos(prefetch_count=20)  # the call that died of the refused acks
    assert _drain_until(conn, lambda: len(held) == 12, 10), len(held)
    again = held[6:]
    assert sorted(m.properties["message_id"] for m in again) == ["m0", "m0", "m1", "m1", "m2", "m2"]
    for message in again:
        message.ack()
    consumer.qos(prefetch_count=5)
    _drain_until(conn, lambda: False, 1.0)
    # each old channel closed once, by the 404; never again by an ack of an old tag
    assert sorted(c.beetle_incarnation for c in {m.channel for m in before}) == [1, 1]
    assert len(held) == 12
    assert _settled(brokers)
