"""A TCP proxy in front of one broker, so tests can break the network instead of the process.

Killing a broker closes its sockets cleanly from the kernel's side; real outages are often worse:
a switch drops the link (connections reset, new ones refused) or a host freezes (connections stay
open and nothing moves). `cut()` and `stall()` give those two faults; `restore()` heals both.
`hold_replies()` forwards requests but holds every reply: the server applies a command whose
reply never reaches a client that gives up waiting, which is how a reply gets lost.
`delay(ms)` adds latency: every byte waits `ms` in the proxy before it is written on, both
ways (a slow link, not a broken one: nothing is lost or reordered); `restore()` ends it.

One thread runs a selectors loop. Control calls are queued to that thread and return once it has
applied them, so after `cut()` returns every connection through the proxy is already reset.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

from celery_beetle.testing.ports import free_port

_CHUNK = 65536
#: bytes a direction may hold back under `delay()` before the proxy stops reading it
_DELAYED_MAX = 1 << 20


class _Link:
    """One client connection and its upstream connection, with bytes waiting to be written."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.pending: dict[socket.socket, bytearray] = {client: bytearray(), upstream: bytearray()}
        self.read_done: set[socket.socket] = set()
        #: per socket to write to: (monotonic time due, bytes) waiting out `delay()`
        self.delayed: dict[socket.socket, deque[tuple[float, bytes]]] = {
            client: deque(),
            upstream: deque(),
        }

    def delayed_bytes(self, sock: socket.socket) -> int:
        return sum(len(data) for _, data in self.delayed[sock])

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client

    @property
    def finished(self) -> bool:
        """Both sides sent EOF and everything read has been written on."""
        return (
            len(self.read_done) == 2
            and not any(self.pending.values())
            and not any(self.delayed.values())
        )


class _Command:
    """A control call waiting for the loop thread, which runs it and reports back."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self.done = threading.Event()
        self.error: Exception | None = None


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port` until told to cut or stall."""

    def __init__(self, target_host: str, target_port: int, *, connect_timeout: float = 2) -> None:
        self.target = (target_host, target_port)
        self.connect_timeout = connect_timeout
        self.port = 0
        self.state = "closed"  # forwarding | holding | stalled | cut | closed
        self.delay_ms = 0.0  # added one-way latency while forwarding (`delay()`)
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._links: dict[socket.socket, _Link] = {}
        self._commands: list[_Command] = []
        self._lock = threading.Lock()
        self._waker_r, self._waker_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<TcpProxy {self.host_port} -> {self.target[0]}:{self.target[1]} {self.state}>"

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def connection_count(self) -> int:
        """Client connections the proxy currently holds open."""
        counted: list[int] = []
        self._call(lambda: counted.append(len({id(link) for link in self._links.values()})))
        return counted[0]

    # -- control (any thread) ----------------------------------------------------------------

    def start(self) -> TcpProxy:
        """Listen on a free port (below the ephemeral range, so it is still free to listen on
        again after a cut) and start forwarding."""
        self.port = free_port()
        self._listen()
        self.state = "forwarding"
        self._selector.register(self._waker_r, selectors.EVENT_READ)
        self._set_listening(True)
        self._thread = threading.Thread(target=self._run, name=f"TcpProxy:{self.port}", daemon=True)
        self._thread.start()
        return self

    def cut(self) -> None:
        """Reset every connection and refuse new ones, like a dead link, until `restore()`."""
        self._call(self._do_cut)

    def stall(self) -> None:
        """Keep connections open but move no bytes either way, like a frozen network.

        New connections complete their TCP handshake (the kernel does that) but get no bytes.
        """
        self._call(self._do_stall)

    def hold_replies(self) -> None:
        """Forward client bytes to the server, but hold the server's bytes until `restore()`."""
        self._call(self._do_hold)

    def delay(self, ms: float) -> None:
        """Hold every byte `ms` milliseconds before writing it on, both ways, until
        `restore()` (a link with added latency; order and content unchanged)."""
        self._call(lambda: self._do_delay(ms))

    def restore(self) -> None:
        """Forward again: stalled bytes flow on; after a cut, new connections are accepted;
        added latency ends (bytes still held are written on at once, in order)."""
        self._call(self._do_restore)

    def close(self) -> None:
        """Close every connection and the listener, and stop the thread."""
        if self._thread is None:
            return
        self._call(self._do_close)
        self._thread.join(timeout=5)
        self._thread = None
        self._waker_r.close()
        self._waker_w.close()
        self._selector.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, action: Callable[[], None]) -> None:
        if self._thread is None:
            raise RuntimeError("TcpProxy is not running")
        command = _Command(action)
        with self._lock:
            self._commands.append(command)
        self._waker_w.send(b"x")
        if not command.done.wait(timeout=10):
            raise RuntimeError("TcpProxy thread did not respond")
        if command.error is not None:
            raise command.error

    # -- the loop thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while self.state != "closed":
            for key, events in self._selector.select(self._next_due()):
                sock = key.fileobj
                if sock is self._waker_r:
                    self._run_commands()
                elif sock is self._listener:
                    self._accept()
                elif sock in self._links:
                    self._service(self._links[sock], sock, events)
            self._release_due()

    def _next_due(self) -> float | None:
        """Seconds until the next delayed bytes are due (None: nothing delayed)."""
        due = [queue[0][0] for link in self._links.values() for queue in link.delayed.values()
               if queue]  # fmt: skip
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _release_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for link in {id(link): link for link in self._links.values()}.values():
            moved = False
            for sock, queue in link.delayed.items():
                while queue and (everything or queue[0][0] <= now):
                    link.pending[sock] += queue.popleft()[1]
                    moved = True
            if moved:
                self._update(link)

    def _run_commands(self) -> None:
        self._waker_r.recv(_CHUNK)
        with self._lock:
            commands, self._commands = self._commands, []
        for command in commands:
            try:
                command.action()
            except Exception as exc:  # handed to the caller, e.g. restore() finding the port taken
                command.error = exc
            finally:
                command.done.set()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(self.target, timeout=self.connect_timeout)
        except OSError:
            _reset(client)  # the target is down: the client sees its connection reset
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(client, upstream)
        self._links[client] = self._links[upstream] = link
        self._update(link)

    def _service(self, link: _Link, sock: socket.socket, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                buffer = link.pending[sock]
                sent = sock.send(buffer)
                del buffer[:sent]
                if not buffer and not link.delayed[sock] and link.peer(sock) in link.read_done:
                    sock.shutdown(socket.SHUT_WR)
            if events & selectors.EVENT_READ:
                data = sock.recv(_CHUNK)
                peer = link.peer(sock)
                if data and self.delay_ms:
                    link.delayed[peer].append((time.monotonic() + self.delay_ms / 1000, data))
                elif data:
                    link.pending[peer] += data
                else:
                    link.read_done.add(sock)
                    if not link.pending[peer] and not link.delayed[peer]:
                        peer.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(link, reset=True)
            return
        if link.finished:
            self._drop(link, reset=False)
        else:
            self._update(link)

    def _update(self, link: _Link) -> None:
        """Register what each socket of `link` waits for; nothing at all while stalled."""
        for sock in (link.client, link.upstream):
            mask = 0
            if self.state in ("forwarding", "holding"):
                # holding: nothing read from the server, nothing written to the client
                held = self.state == "holding"
                # Read only when the bytes read before have been written on (backpressure);
                # under `delay()` up to _DELAYED_MAX may wait to be written on.
                peer = link.peer(sock)
                readable = (
                    sock not in link.read_done
                    and not link.pending[peer]
                    and link.delayed_bytes(peer) < _DELAYED_MAX
                )
                if readable and not (held and sock is link.upstream):
                    mask |= selectors.EVENT_READ
                if link.pending[sock] and not (held and sock is link.client):
                    mask |= selectors.EVENT_WRITE
            registered = sock in self._selector.get_map()
            if mask and registered:
                self._selector.modify(sock, mask)
            elif mask:
                self._selector.register(sock, mask)
            elif registered:
                self._selector.unregister(sock)

    def _drop(self, link: _Link, *, reset: bool) -> None:
        for sock in (link.client, link.upstream):
            self._links.pop(sock, None)
            if sock in self._selector.get_map():
                self._selector.unregister(sock)
            if reset:
                _reset(sock)
            else:
                sock.close()

    def _drop_all(self) -> None:
        for link in {id(link): link for link in self._links.values()}.values():
            self._drop(link, reset=True)

    def _set_listening(self, listening: bool) -> None:
        """Accept new connections only while forwarding; stalled ones wait in the backlog."""
        if self._listener is None:
            return
        registered = self._listener in self._selector.get_map()
        if listening and not registered:
            self._selector.register(self._listener, selectors.EVENT_READ)
        elif not listening and registered:
            self._selector.unregister(self._listener)

    def _do_cut(self) -> None:
        self._set_listening(False)
        if self._listener is not None:
            self._listener.close()  # the kernel resets connections still in the backlog
            self._listener = None
        self._drop_all()
        self.state = "cut"

    def _do_stall(self) -> None:
        if self.state == "cut":
            return
        self.state = "stalled"
        self._set_listening(False)
        for link in list(self._links.values()):
            self._update(link)

    def _do_hold(self) -> None:
        if self.state != "forwarding":
            return
        self.state = "holding"
        for link in list(self._links.values()):
            self._update(link)

    def _do_delay(self, ms: float) -> None:
        self.delay_ms = max(0.0, float(ms))

    def _do_restore(self) -> None:
        if self._listener is None:
            self._listen()  # same port: clients reconnect to the address they know
        self.delay_ms = 0.0
        self._release_due(everything=True)
        self.state = "forwarding"
        self._set_listening(True)
        for link in list(self._links.values()):
            self._update(link)

    def _do_close(self) -> None:
        self._set_listening(False)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._drop_all()
        self.state = "closed"


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN, as a broken link looks to the other end."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
