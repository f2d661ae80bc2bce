"""The transport's delivery filter: it sees each delivery before kombu makes a Message of it,
and whatever it does not take (or fails on) goes on to the consumer as before."""

from __future__ import annotations

from typing import Any

from kombu_beetle.channel_host import BROKER_HEADER, tag_deliveries


class Link:
    name = "127.0.0.1:5673"


class Channel:
    beetle_link = Link()


class Raw:
    def __init__(self) -> None:
        self.delivery_info: dict[str, Any] = {"consumer_tag": "tag.3"}
        self.channel = Channel()


class Connection:
    delivery_filter: Any = None


def test_a_delivery_the_filter_takes_never_reaches_the_consumer() -> None:
    seen: list[Any] = []
    filtered: list[tuple[Any, str]] = []
    connection = Connection()

    def take(raw: Any, tag: str, deliver: Any) -> bool:
        filtered.append((raw, tag))
        return True

    connection.delivery_filter = take
    raw = Raw()
    tag_deliveries(seen.append, "tag", connection)(raw)
    assert seen == [] and filtered == [(raw, "tag")]
    assert raw.delivery_info["consumer_tag"] == "tag", "kombu's tag, as for any delivery"
    assert raw.delivery_info[BROKER_HEADER] == "127.0.0.1:5673"


def test_a_delivery_the_filter_leaves_or_fails_on_goes_on_to_the_consumer() -> None:
    seen: list[Any] = []
    connection = Connection()
    deliver = tag_deliveries(seen.append, "tag", connection)
    connection.delivery_filter = lambda raw, tag, on: False
    first = Raw()
    deliver(first)

    def broken(raw: Any, tag: str, on: Any) -> bool:
        raise RuntimeError("a bug in the filter")

    connection.delivery_filter = broken
    second = Raw()
    deliver(second)
    assert seen == [first, second]


def test_the_filter_sends_a_held_delivery_on_through_the_consumer_later() -> None:
    seen: list[Any] = []
    held: list[Any] = []
    connection = Connection()
    connection.delivery_filter = lambda raw, tag, on: held.append((raw, on)) or True
    raw = Raw()
    tag_deliveries(seen.append, "tag", connection)(raw)
    assert seen == []
    message, on = held[0]
    on(message)
    assert seen == [raw]
