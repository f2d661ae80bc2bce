"""``publish_many`` serializes each message's properties once, before anything is written:
the check that AMQP can carry them and the bytes every copy carries are the same work."""

from __future__ import annotations

from typing import Any

import amqp
from amqp import spec

from kombu_beetle.envelope import FLAGS_HEADER
from kombu_beetle.errors import UnencodableMessage
from kombu_beetle.publish import Outgoing
from tests.unit.test_publisher import FakeLink, FakeSub, make_publisher


class CountingMessage(amqp.Message):
    serialized = 0

    def _serialize_properties(self) -> bytes:
        CountingMessage.serialized += 1
        return super()._serialize_properties()  # type: ignore[no-any-return]


def _confirming(publisher: Any) -> None:
    """Fake channels that ack everything written so far at once."""

    def wait(self: FakeSub, *args: Any, callback: Any = None, **kwargs: Any) -> None:
        callback(spec.Basic.Ack, self.beetle_sent, True)

    for name in ("h1", "h2", "h3"):
        sub = publisher.sub_for(FakeLink(name))
        sub.beetle_sent = 0
        sub.wait = wait.__get__(sub)


def _redundant(message_id: str, message_class: type = amqp.Message, **properties: Any) -> Any:
    return message_class(
        b"body", application_headers={FLAGS_HEADER: 1}, message_id=message_id, **properties
    )


def test_a_message_amqp_cannot_carry_is_refused_as_unencodable_and_the_rest_are_sent():
    log: list[tuple[str, str, Any]] = []
    publisher = make_publisher(log)
    _confirming(publisher)
    items = [
        Outgoing(_redundant("m1"), "", "work"),
        Outgoing(_redundant("m2", priority="high"), "", "work"),
        Outgoing(_redundant("m3"), "", "work"),
    ]
    first, bad, third = publisher.publish_many(items)
    assert first.ok and third.ok and first.brokers == ["h1", "h2"]
    assert isinstance(bad.error, UnencodableMessage) and bad.brokers == []
    assert bad.error.message_id == "m2" and str(bad.error).startswith("error: ")
    written = [data for step, _, data in log if step == "write"]
    assert len(written) == 4  # two copies of m1 and of m3, nothing of m2
    assert not any(b"m2" in data for data in written)


def test_each_message_is_serialized_once_for_both_of_its_copies():
    log: list[tuple[str, str, Any]] = []
    publisher = make_publisher(log)
    _confirming(publisher)
    CountingMessage.serialized = 0
    items = [Outgoing(_redundant(f"m{i}", CountingMessage), "", "work") for i in range(3)]
    assert all(outcome.ok for outcome in publisher.publish_many(items))
    assert CountingMessage.serialized == 3
    assert len([step for step, _, _ in log if step == "write"]) == 6


def test_a_plain_message_sent_with_others_is_written_from_its_checked_bytes():
    log: list[tuple[str, str, Any]] = []
    publisher = make_publisher(log)
    _confirming(publisher)
    CountingMessage.serialized = 0
    (outcome,) = publisher.publish_many([Outgoing(CountingMessage(b"x"), "", "plain")])
    assert outcome.ok and outcome.brokers == ["h1"] and CountingMessage.serialized == 1
