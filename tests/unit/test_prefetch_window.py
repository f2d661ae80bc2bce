"""The prefetch window's wire calls per broker channel (kombu_beetle.prefetch), no server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kombu_beetle.prefetch import PrefetchWindow


@dataclass
class Spec:
    queue: str


@dataclass
class FakeSub:
    version: str = "3.10.8"
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    callbacks: dict[str, Any] = field(default_factory=dict)

    @property
    def connection(self) -> Any:
        return type(
            "C", (), {"server_properties": {"product": "RabbitMQ", "version": self.version}}
        )

    def basic_qos(self, size: int, count: int, a_global: bool) -> None:
        self.calls.append(("qos", count, a_global))

    def basic_cancel(self, tag: str) -> None:
        self.calls.append(("cancel", tag))
        del self.callbacks[tag]


def window_for(classic: set[str]) -> tuple[PrefetchWindow, dict[str, Spec]]:
    consumers: dict[str, Spec] = {}

    def consume(sub: FakeSub, tag: str, broker_tag: str) -> None:
        sub.calls.append(("consume", broker_tag))
        sub.callbacks[broker_tag] = tag

    return PrefetchWindow(lambda queue: queue in classic, consume), consumers


def test_classic_queues_get_a_channel_wide_window_that_widens_in_one_call():
    window, consumers = window_for({"celery"})
    sub = FakeSub()
    window.set(0, 8)
    window.apply(sub, consumers)
    consumers["t1"] = Spec("celery")
    window.consume(sub, "t1", consumers)
    window.set(0, 9)
    window.apply(sub, consumers)
    assert sub.calls == [("qos", 8, True), ("consume", "t1"), ("qos", 9, True)]


def test_a_quorum_queue_lifts_the_channel_wide_window_and_widens_by_consuming_again():
    window, consumers = window_for(set())
    sub = FakeSub()
    window.set(0, 8)
    window.apply(sub, consumers)
    consumers["t1"] = Spec("celery")
    window.consume(sub, "t1", consumers)
    window.set(0, 9)
    window.apply(sub, consumers)
    window.set(0, 8)
    window.apply(sub, consumers)
    assert sub.calls[:4] == [
        ("qos", 8, True),
        ("qos", 0, True),
        ("qos", 8, False),
        ("consume", "t1"),
    ]
    assert sub.calls[4:] == [
        ("qos", 9, False), ("cancel", "t1"), ("consume", "t1.1"),
        ("qos", 8, False), ("cancel", "t1.1"), ("consume", "t1.2"),
    ]  # fmt: skip


def test_a_tag_once_cancelled_is_never_consumed_under_again():
    window, consumers = window_for(set())
    sub = FakeSub()
    window.set(0, 8)
    consumers["t1"] = Spec("celery")
    window.consume(sub, "t1", consumers)
    sub.basic_cancel(window.broker_tag(sub, "t1") or "")
    window.forget(sub, "t1")
    window.consume(sub, "t1", consumers)
    assert sub.calls[-1] == ("consume", "t1.1")


def test_rabbitmq_4_gets_per_consumer_windows_even_for_classic_queues():
    window, consumers = window_for({"celery"})
    sub = FakeSub(version="4.0.5")
    window.set(0, 8)
    consumers["t1"] = Spec("celery")
    window.consume(sub, "t1", consumers)
    assert sub.calls == [("qos", 8, False), ("consume", "t1")]


def test_no_window_is_set_before_celery_asks_for_one():
    window, consumers = window_for({"celery"})
    sub = FakeSub()
    consumers["t1"] = Spec("celery")
    window.consume(sub, "t1", consumers)
    assert sub.calls == [("consume", "t1")]
