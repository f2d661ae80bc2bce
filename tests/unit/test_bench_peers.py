"""bench_peers' instruments: counting Redis commands before a task's body from a MONITOR
log, and the slow links' proxies forwarding every byte."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks._links import slow_links
from benchmarks._peer_probes import trips_before_body

FIRST = "0d42f994-f603-473d-a75d-a3df80907807"
SECOND = "1e53a005-a714-484e-b86e-b4e091a18918"


def _monitor_line(when: float, client: str, *args: str) -> str:
    return f"{when:.6f} [0 {client}] " + " ".join(f'"{a}"' for a in args)


def test_counts_client_commands_naming_a_task_before_and_after_its_body(
    tmp_path: Path,
) -> None:
    key = f"beetle:{{q:{FIRST}}}"
    monitor = tmp_path / "monitor.txt"
    monitor.write_text(
        "\n".join(
            [
                _monitor_line(100.0, "127.0.0.1:1", "EVALSHA", "sha", "1", key),
                _monitor_line(100.0, "lua", "HMGET", key, "s"),  # a script's: not a trip
                _monitor_line(100.1, "127.0.0.1:2", "EVALSHA", "sha", "1", key),
                _monitor_line(100.3, "127.0.0.1:1", "EVALSHA", "sha", "1", key),
                _monitor_line(100.4, "127.0.0.1:1", "PING"),
                _monitor_line(101.0, "127.0.0.1:2", "EVALSHA", "sha", "1", f"b:{{q:{SECOND}}}"),
            ]
        )
        + "\n"
    )
    runs = tmp_path / "runs.out"
    runs.write_text("100.200000 0\n101.500000 1\n")  # when each body ran, its argument

    seen = trips_before_body(monitor, [FIRST, SECOND], runs)

    assert seen == {
        "tasks": 2,
        "before_mean": 1.5,
        "before_max": 2,
        "after_mean": 0.5,
        "after_max": 1,
    }


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_slow_links_forward_every_byte_through_their_own_process(echo_port: int) -> None:
    with slow_links(0.5, [echo_port]) as (via, pid):
        assert pid > 0 and via[echo_port] != echo_port
        with socket.create_connection(("127.0.0.1", via[echo_port]), timeout=10) as sock:
            sock.sendall(b"slowly")
            received = b""
            while len(received) < 6:
                received += sock.recv(6)
    assert received == b"slowly"
