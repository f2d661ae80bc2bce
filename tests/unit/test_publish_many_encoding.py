"""``publish_many`` serializes each message's properties once, before anything is written:
the check that AMQP can carry them and the bytes every copy carries are the same work."""

from __future__ import annotations

from typing import Any

import amqp
import pytest
from amqp import spec

from kombu_beetle import frames
from kombu_beetle.envelope import FLAGS_HEADER
from kombu_beetle.errors import UnencodableMessage
from kombu_beetle.properties import encode_properties
from kombu_beetle.publish import Outgoing
from tests.unit.test_publisher import FakeLink, FakeSub, make_publisher


@pytest.fixture
def encodings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The message ids whose properties were serialized, one entry each time."""
    seen: list[str] = []

    def counting(message: amqp.Message) -> bytes:
        seen.append(message.properties["message_id"])
        return encode_properties(message)

    monkeypatch.setattr(frames, "encode_properties", counting)
    return seen


def _confirming(publisher: Any) -> None:
    """Fake channels that ack everything written so far at once."""

    def wait(self: FakeSub, *args: Any, callback: Any = None, **kwargs: Any) -> None:
        callback(spec.Basic.Ack, self.beetle_sent, True)

    for name in ("h1", "h2", "h3"):
        sub = publisher.sub_for(FakeLink(name))
        sub.beetle_sent = 0
        sub.wait = wait.__get__(sub)


def _redundant(message_id: str, **properties: Any) -> amqp.Message:
    return amqp.Message(
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


def test_each_message_is_serialized_once_for_both_of_its_copies(encodings):
    log: list[tuple[str, str, Any]] = []
    publisher = make_publisher(log)
    _confirming(publisher)
    items = [Outgoing(_redundant(f"m{i}"), "", "work") for i in range(3)]
    assert all(outcome.ok for outcome in publisher.publish_many(items))
    assert encodings == ["m0", "m1", "m2"]
    assert len([step for step, _, _ in log if step == "write"]) == 6


def test_a_plain_message_sent_with_others_is_written_from_its_checked_bytes(encodings):
    log: list[tuple[str, str, Any]] = []
    publisher = make_publisher(log)
    _confirming(publisher)
    plain = amqp.Message(b"x", message_id="p1")
    (outcome,) = publisher.publish_many([Outgoing(plain, "", "plain")])
    assert outcome.ok and outcome.brokers == ["h1"] and encodings == ["p1"]


def test_each_message_is_written_as_soon_as_it_is_built_not_after_the_whole_batch(
    monkeypatch: pytest.MonkeyPatch,
):
    log: list[tuple[str, str, Any]] = []
    publisher = make_publisher(log)
    _confirming(publisher)

    def logged(message: amqp.Message) -> bytes:
        log.append(("encode", message.properties["message_id"], None))
        return encode_properties(message)

    monkeypatch.setattr(frames, "encode_properties", logged)
    items = [Outgoing(_redundant(f"m{i}"), "", "work") for i in range(2)]
    assert all(outcome.ok for outcome in publisher.publish_many(items))
    steps = [(step, name) for step, name, _ in log]
    assert steps == [
        ("encode", "m0"),
        ("write", "h1"),
        ("write", "h2"),
        ("encode", "m1"),
        ("write", "h1"),
        ("write", "h2"),
    ]
