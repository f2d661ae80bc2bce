"""Which errors blame a broker: a torn-down connection does, a bug on a healthy one does not."""

from __future__ import annotations

import pytest

from kombu_beetle.brokers import BrokerChannel, BrokerLink, fail_or_raise, is_link_error
from kombu_beetle.options import build_options


class FakeTransport:
    def __init__(self) -> None:
        self.sock: object | None = object()


class FakeConn:
    def __init__(self) -> None:
        self.transport: FakeTransport | None = FakeTransport()

    @property
    def connected(self) -> bool:
        return self.transport is not None and self.transport.sock is not None

    def collect(self) -> None:
        self.transport = None


def live_link() -> BrokerLink:
    options = build_options("beetle://h1//")
    link = BrokerLink(options.brokers[0], options, clock=lambda: 0.0)
    link.conn = FakeConn()  # type: ignore[assignment]
    return link


def test_an_attribute_error_on_a_healthy_connection_propagates_and_the_broker_stays_alive():
    link = live_link()
    bug = AttributeError("'dict' object has no attribute 'routing_key'")
    assert not is_link_error(link, bug)
    with pytest.raises(AttributeError, match="routing_key"):
        fail_or_raise(link, bug)
    assert link.alive


@pytest.mark.parametrize("tear_down", ["transport", "socket", "connection"])
def test_an_attribute_error_after_the_connection_was_torn_down_marks_the_broker_dead(tear_down):
    link = live_link()
    conn = link.conn
    assert conn is not None
    if tear_down == "transport":
        conn.transport = None
    elif tear_down == "socket":
        conn.transport.sock = None  # type: ignore[union-attr]
    else:
        link.conn = None
    error = AttributeError("'NoneType' object has no attribute 'write'")
    assert is_link_error(link, error)
    fail_or_raise(link, error)
    assert not link.alive


@pytest.mark.parametrize("error", [TimeoutError("timed out"), ConnectionResetError(104, "reset")])
def test_socket_errors_mark_a_healthy_looking_broker_dead(error):
    link = live_link()
    fail_or_raise(link, error)
    assert not link.alive and link.last_error is error


def test_an_error_from_a_consumer_callback_propagates_even_when_it_looks_like_a_link_error():
    link = live_link()
    error = ConnectionResetError(104, "raised by application code")
    error._beetle_from_callback = True  # type: ignore[attr-defined]
    with pytest.raises(ConnectionResetError):
        fail_or_raise(link, error)
    assert link.alive


def _channel_on(link: BrokerLink) -> BrokerChannel:
    channel = BrokerChannel.__new__(BrokerChannel)
    channel.connection = link.conn
    channel.is_open = True
    channel.beetle_link = link
    return channel


def test_an_ack_that_hits_a_bug_raises_instead_of_dropping_the_broker():
    link = live_link()

    def buggy_ack() -> None:
        raise AttributeError("'NoneType' object has no attribute 'delivery_tag'")

    with pytest.raises(AttributeError):
        _channel_on(link)._link_call(buggy_ack)
    assert link.alive


def test_an_ack_on_a_connection_torn_down_under_it_is_dropped_and_the_broker_marked_dead():
    link = live_link()
    channel = _channel_on(link)

    def ack_on_closed_transport() -> None:
        link.conn.transport = None  # type: ignore[union-attr]
        raise AttributeError("'NoneType' object has no attribute 'write'")

    assert channel._link_call(ack_on_closed_transport) is None
    assert not link.alive
