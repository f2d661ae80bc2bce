"""The chaos tests trust TcpProxy to fake network faults; check it against a local echo server."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from celery_beetle.testing.proxy import TcpProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: object, client_address: object) -> None:
        """Resets are what these tests cause; socketserver would print each one."""


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo_port: int) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", echo_port) as proxy:
        yield proxy


def _connect(proxy: TcpProxy, timeout: float = 2) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _assert_silent(sock: socket.socket, seconds: float = 0.3) -> None:
    sock.settimeout(seconds)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.settimeout(2)


def test_bytes_pass_both_ways(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        sock.sendall(b"hello")
        assert _recv_exactly(sock, 5) == b"hello"


def test_a_large_payload_arrives_whole_in_order(proxy: TcpProxy) -> None:
    payload = bytes(range(256)) * 16384  # 4 MiB: more than any socket buffer, so it backs up
    received: list[bytes] = []
    with _connect(proxy, timeout=10) as sock:
        reader = threading.Thread(target=lambda: received.append(_recv_exactly(sock, len(payload))))
        reader.start()
        sock.sendall(payload)
        reader.join(timeout=20)
    assert received == [payload]


def test_half_close_is_forwarded_so_the_server_sees_eof(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert _recv_exactly(sock, 100) == b"last words"  # then EOF from the server
        assert sock.recv(1) == b""


def test_cut_resets_open_connections(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        sock.sendall(b"x")
        assert _recv_exactly(sock, 1) == b"x"
        proxy.cut()
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"y")
            sock.recv(1)


def test_cut_refuses_new_connections_until_restored(proxy: TcpProxy) -> None:
    proxy.cut()
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy)
    proxy.restore()
    with _connect(proxy) as sock:
        sock.sendall(b"back")
        assert _recv_exactly(sock, 4) == b"back"


def test_stall_holds_bytes_of_an_open_connection_until_restored(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        proxy.stall()
        sock.sendall(b"frozen")
        _assert_silent(sock)
        assert proxy.connection_count == 1  # held open, not reset
        proxy.restore()
        assert _recv_exactly(sock, 6) == b"frozen"


def test_a_connection_opened_during_a_stall_gets_no_bytes_until_restored(proxy: TcpProxy) -> None:
    proxy.stall()
    with _connect(proxy) as sock:  # the kernel completes the handshake from the backlog
        sock.sendall(b"early")
        _assert_silent(sock)
        proxy.restore()
        assert _recv_exactly(sock, 5) == b"early"


def test_a_dead_target_resets_the_client(echo_port: int) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead_port = placeholder.getsockname()[1]  # bound, never listening: connects are refused
        with (
            TcpProxy("127.0.0.1", dead_port) as proxy,
            pytest.raises(ConnectionResetError),  # the reset may even beat connect() returning
            _connect(proxy) as sock,
        ):
            sock.recv(1)


def test_close_ends_open_connections_and_the_listener(echo_port: int) -> None:
    proxy = TcpProxy("127.0.0.1", echo_port).start()
    sock = _connect(proxy)
    proxy.close()
    with sock, pytest.raises(ConnectionResetError):
        sock.recv(1)
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy)


def test_delay_adds_latency_both_ways_in_order_and_restore_ends_it(proxy: TcpProxy) -> None:
    with _connect(proxy, timeout=5) as sock:
        proxy.delay(250)
        began = time.monotonic()
        sock.sendall(b"slow")
        sock.sendall(b"ly")
        assert _recv_exactly(sock, 6) == b"slowly"  # out and back: two delays, in order
        assert time.monotonic() - began >= 0.49
        payload = bytes(range(256)) * 8192  # 2 MiB: more than a direction may hold back
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.append(_recv_exactly(sock, len(payload))))
        reader.start()
        sock.sendall(payload)
        reader.join(timeout=20)
        assert received == [payload]
        proxy.restore()
        began = time.monotonic()
        sock.sendall(b"fast")
        assert _recv_exactly(sock, 4) == b"fast"
        # a delay left behind would cost 0.5 s; the bare round trip took up to 0.18 s on a
        # loaded machine
        assert time.monotonic() - began < 0.25
