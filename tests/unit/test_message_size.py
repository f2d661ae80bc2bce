"""A body over max_message_bytes is refused before any broker is touched (no server)."""

from __future__ import annotations

import amqp
import pytest
from kombu.exceptions import OperationalError

from kombu_beetle.errors import MessageTooLarge
from kombu_beetle.frames import body_size
from kombu_beetle.options import build_options
from kombu_beetle.publish import Publisher
from kombu_beetle.trace import NullTracer


class NoBrokers:
    """A broker set the refusal must never reach."""

    def candidates(self):
        raise AssertionError("a broker was chosen for an oversized message")


def publisher(limit: int) -> Publisher:
    options = build_options("beetle://h1,h2//", {"max_message_bytes": limit})

    def untouched(*args):
        raise AssertionError("the publisher touched a broker or the connection")

    return Publisher(options, NoBrokers(), NullTracer(), untouched, untouched)  # type: ignore[arg-type]


def test_a_body_over_the_limit_is_refused_with_its_size_the_limit_its_id_and_the_option():
    message = amqp.Message(b"x" * 1001, message_id="m-1")
    with pytest.raises(MessageTooLarge) as error:
        publisher(1000).publish(message, "work", "work.key")
    text = str(error.value)
    for part in ("m-1", "1001-byte", "1000-byte", "'work.key'", "max_message_bytes"):
        assert part in text
    assert (error.value.size, error.value.limit) == (1001, 1000)


def test_message_too_large_is_a_value_error_that_celery_will_not_retry():
    assert issubclass(MessageTooLarge, ValueError)
    assert not issubclass(MessageTooLarge, OperationalError)


def test_a_text_body_is_measured_in_encoded_bytes():
    assert body_size(amqp.Message("é" * 600), at_most=1000) == 1200
    with pytest.raises(MessageTooLarge):
        publisher(1000).publish(amqp.Message("é" * 600), "", "q")


def test_a_short_text_body_is_not_encoded_just_to_measure_it():
    class Body(str):
        def encode(self, *args, **kwargs):
            raise AssertionError("encoded to be measured")

    assert body_size(amqp.Message(Body("é" * 10)), at_most=1000) <= 1000
