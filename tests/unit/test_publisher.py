"""The Publisher's steps, on fake brokers: what is written where, and in which order."""

from __future__ import annotations

from typing import Any

import amqp

from kombu_beetle.envelope import FLAGS_HEADER
from kombu_beetle.options import build_options
from kombu_beetle.publish import Publisher
from kombu_beetle.trace import NullTracer


class FakeTransport:
    def __init__(self, name: str, log: list[tuple[str, str, Any]]) -> None:
        self.name, self.log, self.sock = name, log, object()

    def write(self, data: bytes) -> None:
        self.log.append(("write", self.name, data))


class FakeConnection:
    frame_max = 131072
    bytes_sent = 0

    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport


class FakeSub:
    """A py-amqp channel in confirm mode: records writes and confirm waits."""

    channel_id = 1

    def __init__(self, name: str, log: list[tuple[str, str, Any]]) -> None:
        self.name, self.log = name, log
        self.connection = FakeConnection(FakeTransport(name, log))

    def wait(self, *args: Any, **kwargs: Any) -> None:
        self.log.append(("confirm", self.name, None))


class FakeLink:
    alive = True

    def __init__(self, name: str) -> None:
        self.name = name


class FakeBrokers:
    def __init__(self, links: list[FakeLink]) -> None:
        self.links = links

    def candidates(self) -> list[FakeLink]:
        return list(self.links)

    def names(self) -> list[str]:
        return [link.name for link in self.links]


def make_publisher(log: list[tuple[str, str, Any]]) -> Publisher:
    subs = {name: FakeSub(name, log) for name in ("h1", "h2", "h3")}
    brokers = FakeBrokers([FakeLink(name) for name in subs])
    options = build_options("beetle://h1,h2,h3//")
    return Publisher(
        options,
        brokers,  # type: ignore[arg-type]
        NullTracer(),
        lambda link: subs[link.name],  # type: ignore[arg-type, return-value]
        lambda: None,
    )


def test_both_copies_are_written_before_either_confirm_is_awaited():
    log: list[tuple[str, str, Any]] = []
    message = amqp.Message(b"body", application_headers={FLAGS_HEADER: 1})
    taken = make_publisher(log).publish(message, "work", "work")
    assert taken == ["h1", "h2"]
    assert [(step, name) for step, name, _ in log] == [
        ("write", "h1"),
        ("write", "h2"),
        ("confirm", "h1"),
        ("confirm", "h2"),
    ]


def test_the_frames_of_a_redundant_message_are_built_once_and_written_to_both_brokers():
    log: list[tuple[str, str, Any]] = []
    message = amqp.Message(b"body", application_headers={FLAGS_HEADER: 1})
    publisher = make_publisher(log)
    copies = publisher.choose(message, "work")
    batch = publisher.write(copies, "work", "work", False, False)
    assert [link.name for link, _ in batch] == ["h1", "h2"]
    assert copies.encoded is not None and list(copies.encoded) == [1]
    first, second = (data for step, _, data in log if step == "write")
    assert first is second  # the same bytes object, not a second encoding
    assert copies.done == []  # nothing confirmed until the confirms are awaited
    publisher.await_confirms(copies, batch)
    assert [link.name for link in copies.done] == ["h1", "h2"]


def test_a_plain_message_goes_to_one_broker_and_is_not_pre_encoded():
    log: list[tuple[str, str, Any]] = []
    publisher = make_publisher(log)
    copies = publisher.choose(amqp.Message(b"body"), "work")
    assert (copies.wanted, copies.encoded, copies.redundant) == (1, None, False)
