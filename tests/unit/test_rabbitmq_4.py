"""RabbitMQ 4's refusals, met at the channel level: channels that answer as 4.x does.

RabbitMQ 3.10 (the brokers the integration tests start) accepts what 4.x refuses, so these
fakes refuse it the way 4.x replies: a global prefetch on a channel consuming a quorum queue
(``540 NOT_IMPLEMENTED``, which closes the connection), and, from 4.3, a transient queue that
is not exclusive (``541``, ``transient_nonexcl_queues`` denied).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import amqp
import pytest

from celery_beetle.worker.deadletter import publish_dead_letter
from celery_beetle.worker.retry_queue import RawMessage, publish_delayed
from kombu_beetle.prefetch import PrefetchWindow


@dataclass
class Spec:
    queue: str


@dataclass
class Rabbit4Channel:
    """Refuses what RabbitMQ 4.3 refuses, and records what it accepted."""

    version: str = "4.3.0"
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def connection(self) -> Any:
        return type(
            "C", (), {"server_properties": {"product": "RabbitMQ", "version": self.version}}
        )

    def basic_qos(self, size: int, count: int, a_global: bool) -> None:
        if a_global:
            raise amqp.exceptions.AMQPNotImplementedError(
                "NOT_IMPLEMENTED - queue 'celery' in vhost '/' does not support global qos"
            )
        self.calls.append(("qos", count))

    def basic_cancel(self, tag: str) -> None:
        self.calls.append(("cancel", tag))

    def queue_declare(
        self, queue: str, durable: bool = False, exclusive: bool = False, **kwargs: Any
    ) -> None:
        if not durable and not exclusive:
            raise amqp.exceptions.InternalError(
                f"INTERNAL_ERROR - queue '{queue}' declared as transient non-exclusive: "
                "transient_nonexcl_queues is deprecated and denied"
            )
        self.calls.append(("declare", queue))


class Producer:
    def __init__(self) -> None:
        self.channel = Rabbit4Channel()
        self.published: list[str] = []

    def publish(self, body: bytes, routing_key: str, **kwargs: Any) -> None:
        self.published.append(routing_key)


def test_a_widening_window_never_asks_rabbitmq_4_for_a_global_prefetch():
    consumers: dict[str, Spec] = {}
    window = PrefetchWindow(
        lambda queue: queue == "classic", lambda sub, tag, broker_tag: sub.calls.append(tag)
    )
    channel = Rabbit4Channel()
    window.set(0, 8)
    for tag, queue in (("t1", "celery"), ("t2", "classic")):
        consumers[tag] = Spec(queue)
        window.consume(channel, tag, consumers)
    window.set(0, 9)  # Celery widens the window for a countdown task it holds
    window.set(0, 8)
    assert ("qos", 8) in channel.calls
    with pytest.raises(amqp.exceptions.AMQPNotImplementedError):  # the fake refuses as 4.x
        channel.basic_qos(0, 8, True)


@pytest.mark.parametrize("delay_ms", [0, 5000])
def test_retries_and_dead_letters_declare_only_durable_queues_that_rabbitmq_4_3_accepts(delay_ms):
    producer = Producer()
    raw = RawMessage(b"{}", "application/json", "utf-8", {"task": "shop.charge"}, {})
    went_to = publish_delayed(producer, raw, "orders", delay_ms)
    dead = publish_dead_letter(producer, raw, "orders", {"x-beetle-dead-reason": "attempts_limit"})
    assert producer.published == [went_to, dead]
    assert [call[0] for call in producer.channel.calls] == ["declare", "declare"]
