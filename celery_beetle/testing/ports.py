"""OS plumbing the server wrappers share: free ports, waiting for them, and watching pids.

Ports come from below the kernel's ephemeral range: a port the kernel handed out for binding to
port 0 may, a moment later, become the local end of some client connection (the harness's own
readiness probes open many), and the server that wanted it fails with EADDRINUSE. A process-wide
set of ports already handed out keeps parallel starts from picking the same number twice.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from pathlib import Path

_lock = threading.Lock()
_handed_out: set[int] = set()


def free_port(also_at: int = 0) -> int:
    """Return a port outside the ephemeral range that nothing holds and we have not handed out.

    ``also_at``: the server binds ``port + also_at`` too (a Redis Cluster node's bus, 10000
    above), so that one must be free as well; it may lie in the ephemeral range, where a
    client socket can take it before the server binds it, so the caller retries on a clash."""
    low, high = _server_range()
    with _lock:
        for _ in range(1000):
            port = random.randint(low, high)
            if port in _handed_out or not _bindable(port):
                continue
            if also_at and (
                port + also_at > 65535
                or port + also_at in _handed_out
                or not _bindable(port + also_at)
            ):
                continue
            _handed_out.add(port)
            if also_at:
                _handed_out.add(port + also_at)
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


def _server_range() -> tuple[int, int]:
    """Up to 12,000 ports just below the ephemeral range (or above it, if it starts low)."""
    try:
        first, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        first, last = 32768, 60999
    if first > 11024:
        return first - 12000, first - 1
    return last + 1, 65535


def _bindable(port: int) -> bool:
    # The wildcard address also catches servers that listen on one interface only.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def process_alive(pid: int | None) -> bool:
    """True while `pid` exists and is not a zombie (a killed child nobody reaped yet is dead)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    # The state letter follows the command name, which is in parentheses and may hold spaces.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_until_gone(pids: list[int], timeout: float) -> bool:
    """Wait until none of `pids` is alive; False if one still is after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while any(process_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file, for error messages when a server fails to start."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])
