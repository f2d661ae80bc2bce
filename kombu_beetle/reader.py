"""Reading a broker's frames in bulk on the event loop.

py-amqp reads exactly the bytes it needs, frame by frame: a delivery is three frames (method,
header, body), each read as three ``recv`` calls (the 7-byte header, the payload, the end
octet), and every ``drain_events(timeout=0)`` switches the socket to non-blocking and back
around each frame (four ``fcntl`` calls). On Celery's event loop a transport then reads one
delivery per loop pass. A redundant message arrives twice, so all of that is paid twice.

:class:`BufferedTransport` keeps py-amqp's contract (``_read(n)`` returns exactly ``n``
bytes, and py-amqp's own waits for a reply work unchanged) and adds a buffer in front of
the socket that only the event loop's reader fills: :func:`read_available` takes what the
socket holds with one non-blocking read (up to :data:`CHUNK` bytes) and hands every complete
frame to py-amqp's frame handler, up to :data:`FRAMES_PER_PASS` per loop pass; what is left
is read in the next pass (the socket will not say "readable" for bytes already taken from
it). Reads outside the loop (py-amqp waiting for a reply) take what is buffered first and
never read ahead: no frame is left in the buffer without a pass scheduled to handle it.

Only for plain TCP: a TLS socket has its own buffer (``pending()``), and keeps py-amqp's
transport.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import Any

from amqp.transport import TCPTransport

__all__ = ["CHUNK", "FRAMES_PER_PASS", "BufferedTransport", "read_available"]

#: the most one read takes from the socket
CHUNK = 256 * 1024
#: frames handled in one loop pass before the loop's other work gets a turn
FRAMES_PER_PASS = 256
_HEADER = struct.Struct(">BHI")
_UNAVAILABLE = (errno.EAGAIN, errno.EINTR)


class BufferedTransport(TCPTransport):
    """py-amqp's TCP transport, reading ahead into a buffer (see the module)."""

    def _setup_transport(self) -> None:
        super()._setup_transport()
        self._buf = bytearray()
        self._pos = 0

    # py-amqp reads and restores ``_read_buffer`` (a frame cut short by a timeout puts its
    # bytes back): the unread bytes, as bytes
    @property
    def _read_buffer(self) -> bytes:
        return bytes(self._buf[self._pos :])

    @_read_buffer.setter
    def _read_buffer(self, value: bytes) -> None:
        self._buf = bytearray(value)
        self._pos = 0

    def _read(
        self, n: int, initial: bool = False, _errnos: tuple[int, ...] = _UNAVAILABLE
    ) -> bytes:
        """Exactly ``n`` bytes: from the buffer, then from the socket, never more than
        asked (errors as py-amqp's ``_read``). py-amqp reads so while it waits for a reply
        (a confirm, a ``consume-ok``), outside the event loop: bytes read ahead there would
        be frames nobody handles until the broker sends more."""
        while len(self._buf) - self._pos < n:
            try:
                data = self._quick_recv(n - (len(self._buf) - self._pos))
            except OSError as exc:
                if exc.errno in _errnos:
                    if initial and self.raise_on_initial_eintr:
                        raise TimeoutError() from exc
                    continue
                raise
            if not data:
                raise OSError("Server unexpectedly closed connection")
            self._append(data)
        return self._take(n)

    def _append(self, data: bytes) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf = bytearray(data)
            self._pos = 0
        else:
            if self._pos > CHUNK:  # drop what was read before it grows
                del self._buf[: self._pos]
                self._pos = 0
            self._buf += data

    def _take(self, n: int) -> bytes:
        start = self._pos
        self._pos = start + n
        return bytes(self._buf[start : start + n])

    def frame_buffered(self) -> bool:
        """True when the buffer holds at least one complete frame."""
        available = len(self._buf) - self._pos
        if available < _HEADER.size:
            return False
        size = _HEADER.unpack_from(self._buf, self._pos)[2]
        return available >= _HEADER.size + size + 1

    def fill(self) -> bool:
        """Take what the socket holds now, without waiting; False when it held nothing.
        A closed peer raises ``OSError``, as py-amqp's read does."""
        sock = self.sock
        try:
            if sock.gettimeout():  # Python keeps such a socket non-blocking underneath
                data = os.read(sock.fileno(), CHUNK)
            else:
                data = sock.recv(CHUNK, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        if not data:
            raise OSError("Server unexpectedly closed connection")
        self._append(data)
        return True


def read_available(conn: Any) -> bool:
    """Handle the complete frames ``conn`` (a py-amqp connection over a
    :class:`BufferedTransport`) has, reading the socket once when the buffer holds none;
    True when complete frames are left for the next pass."""
    transport: BufferedTransport = conn.transport
    if not transport.frame_buffered() and not transport.fill():
        return False
    handle = conn.on_inbound_frame
    read_frame = transport.read_frame
    for _ in range(FRAMES_PER_PASS):
        if not transport.frame_buffered():
            return False
        handle(read_frame())
    return transport.frame_buffered()
