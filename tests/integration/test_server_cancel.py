"""A queue deleted under its consumer (a migration re-creating it): the consumer alone is
consumed again once the queue is back, without dropping the broker's connection."""

from __future__ import annotations

import time

import pika
from kombu import Connection, Consumer, Queue

import kombu_beetle  # noqa: F401
from kombu_beetle.channel import REDECLARE_AFTER_S


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


def test_a_queue_deleted_and_recreated_is_consumed_again_without_a_reconnect(brokers):
    node = brokers.nodes[0]
    got: list[bytes] = []
    with Connection(brokers.beetle_url) as conn:
        channel = conn.channel()
        consumer = Consumer(
            channel,
            [Queue("jobs", durable=True)],
            callbacks=[lambda b, m: (got.append(b), m.ack())],
        )
        consumer.consume()
        link = next(li for li in conn.connection.brokers if li.name == node.host_port)
        generation = link.generation
        with node.connect(brokers.vhost) as admin:
            ch = admin.channel()
            ch.queue_delete("jobs")
            _drain_until(conn, lambda: False, 0.5)  # the cancel arrives
            ch.queue_declare("jobs", durable=True, arguments={"x-queue-type": "quorum"})
            ch.basic_publish("", "jobs", b"after", pika.BasicProperties(message_id="m1"))
        assert _drain_until(conn, lambda: got == ["after"], 10), got
        assert link.generation == generation, "the broker's connection was not dropped"
        assert link.alive


def test_a_queue_that_stays_deleted_is_declared_again_as_a_reconnect_would(brokers):
    node = brokers.nodes[1]
    got: list[bytes] = []
    with Connection(brokers.beetle_url) as conn:
        consumer = Consumer(
            conn.channel(),
            [Queue("jobs", durable=True)],
            callbacks=[lambda b, m: (got.append(b), m.ack())],
        )
        consumer.consume()
        with node.connect(brokers.vhost) as admin:
            admin.channel().queue_delete("jobs")
        assert _drain_until(
            conn, lambda: "jobs" in node.queue_depths(brokers.vhost), REDECLARE_AFTER_S + 5
        )
        with node.connect(brokers.vhost) as admin:
            admin.channel().basic_publish("", "jobs", b"again")
        assert _drain_until(conn, lambda: got == ["again"], 10), got
