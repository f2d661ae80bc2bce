"""Reading a broker's frames in bulk (kombu_beetle.reader), over a socket pair."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from kombu_beetle import reader
from kombu_beetle.reader import BufferedTransport, read_available


def _frame(channel: int, payload: bytes, kind: int = 1) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


@pytest.fixture
def pair() -> Iterator[tuple[BufferedTransport, socket.socket]]:
    ours, broker = socket.socketpair()
    ours.settimeout(1.0)  # as the connection sets it: non-blocking underneath
    transport = BufferedTransport.__new__(BufferedTransport)
    transport.sock = ours
    transport.raise_on_initial_eintr = True
    transport._setup_transport()
    yield transport, broker
    ours.close()
    broker.close()


class _Conn:
    def __init__(self, transport: BufferedTransport) -> None:
        self.transport = transport
        self.frames: list[Any] = []

    def on_inbound_frame(self, frame: Any) -> None:
        self.frames.append(frame)


def test_every_complete_frame_the_socket_holds_is_handled_in_one_pass(
    pair: tuple[BufferedTransport, socket.socket],
) -> None:
    transport, broker = pair
    broker.sendall(b"".join(_frame(1, b"x" * n) for n in range(1, 11)))
    conn = _Conn(transport)
    assert read_available(conn) is False
    assert [len(payload) for _, _, payload in conn.frames] == list(range(1, 11))


def test_a_frame_cut_short_waits_for_the_rest(
    pair: tuple[BufferedTransport, socket.socket],
) -> None:
    transport, broker = pair
    whole = _frame(3, b"payload")
    broker.sendall(_frame(2, b"first") + whole[:5])
    conn = _Conn(transport)
    read_available(conn)
    assert [payload for _, _, payload in conn.frames] == [b"first"]
    assert not transport.frame_buffered()
    broker.sendall(whole[5:])
    read_available(conn)
    assert [payload for _, _, payload in conn.frames] == [b"first", b"payload"]


def test_frames_past_the_pass_limit_are_left_for_the_next_pass(
    pair: tuple[BufferedTransport, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    transport, broker = pair
    monkeypatch.setattr(reader, "FRAMES_PER_PASS", 3)
    broker.sendall(b"".join(_frame(1, bytes([n])) for n in range(5)))
    conn = _Conn(transport)
    assert read_available(conn) is True  # two frames left: the loop must come back
    assert len(conn.frames) == 3
    assert read_available(conn) is False
    assert len(conn.frames) == 5


def test_an_empty_socket_is_not_waited_on(pair: tuple[BufferedTransport, socket.socket]) -> None:
    transport, _ = pair
    assert transport.fill() is False
    assert read_available(_Conn(transport)) is False


def test_a_closed_peer_is_an_error_as_in_py_amqp(
    pair: tuple[BufferedTransport, socket.socket],
) -> None:
    transport, broker = pair
    broker.close()
    with pytest.raises(OSError, match="unexpectedly closed"):
        transport.fill()


def test_a_wait_outside_the_loop_reads_the_buffer_first_and_never_reads_ahead(
    pair: tuple[BufferedTransport, socket.socket],
) -> None:
    transport, broker = pair
    first, second, third = _frame(1, b"a"), _frame(1, b"bb"), _frame(1, b"ccc")
    broker.sendall(first + second[:4])
    transport.fill()
    broker.sendall(second[4:] + third)
    assert transport.read_frame()[2] == b"a"  # from the buffer
    assert transport.read_frame()[2] == b"bb"  # its start buffered, the rest read exactly
    assert transport._read_buffer == b""  # the third frame stays in the socket
    assert transport.fill() and transport.frame_buffered()


def test_frames_after_one_whose_handler_raised_stay_buffered_for_the_next_pass(
    pair: tuple[BufferedTransport, socket.socket],
) -> None:
    transport, broker = pair
    broker.sendall(b"".join(_frame(1, bytes([n])) for n in range(4)))
    conn = _Conn(transport)
    handled = conn.frames

    def handle(frame: Any) -> None:
        handled.append(frame)
        if len(handled) == 2:
            raise RuntimeError("a consumer's callback failed")

    conn.on_inbound_frame = handle  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        read_available(conn)
    assert transport.frame_buffered()  # the connection gives them a pass of their own
    read_available(conn)
    assert [payload for _, _, payload in handled] == [b"\x00", b"\x01", b"\x02", b"\x03"]
