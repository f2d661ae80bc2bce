"""Acks in batches: what the event loop settles within a few milliseconds goes to each broker
in one write.

A redundant message is delivered twice, and both copies are acked: on one broker per copy.
py-amqp writes every ack as its own frame and its own ``sendall``, and on loopback or a fast
LAN a send costs the sender the whole TCP path and a wake-up of the broker however small the
frame (on a virtual machine a wake-up of another CPU is dearer still: in the benchmarks the
acks' writes were a fifth of the worker's main process). So acks made on Celery's event loop
are not written at once: :class:`AckBatcher` collects them per broker channel for
:data:`ACK_DELAY_S` (or until :data:`ACK_BATCH_MAX` wait), then writes all of one
connection's in one ``write``. A channel whose prefetch window is full of acks waiting here
is written at once instead: the worker holds nothing else of it, and its broker delivers
nothing more until acks come (with a window of one, every ack goes at once):

- a run of acks that covers every delivery still unsettled on the channel from the oldest
  up goes as **one** ``basic.ack`` with ``multiple=True`` (the broker settles the run at
  once);
- the others go as single-tag acks, coalesced into the same write.

What makes ``multiple`` safe is :class:`Unsettled`: the delivery tags a channel received and
has not settled, in the order they arrived. A multiple ack names the newest tag of a prefix
of that order only when every tag of the prefix is being acked; a delivery still held (a
countdown task, a deferred copy, a run in the pool) stops the prefix, and the acks after it
go one by one. Rejects and nacks are never delayed (a requeue should reach the broker at
once); they only leave the unsettled set.

An ack is never sent earlier than asked, only a little later: a worker killed in between
leaves the message unacked, and the broker delivers it again (the dedup store drops it). The
delay is short beside a task (three milliseconds): a message waiting for its ack still
counts in the broker's prefetch window, so a long one would narrow the window. At a few
hundred tasks a second it holds one or two messages of a window of eight (Celery's default
for two processes), and each write it saves spares a broker a wake-up.
Acks of a channel closed and reopened since (py-amqp reopens the same object, with tags
counted from 1 again) are dropped with its unsettled set: the broker gave those messages
back. Acks from other threads (the threads pool's callbacks) are written at once, as before,
under the connection's frame lock, which the batch's write takes too.

The loop's thread may also be asked to wait for a broker outside the loop: Celery's worker
begins its loop with ``drain_events(timeout=0.1)``, and the early acks of the deliveries it
received while it started consuming (bodies the threads pool began at once) wait as
callbacks of that same pass. A broker whose prefetch window those acks fill sends nothing
that would end the wait, so the acks would wait the whole 0.1 s, and a worker killed then
would run those bodies again. So on the loop's thread ``drain_events`` writes the batch and
does not wait (:meth:`~kombu_beetle.connection.BeetleConnection.drain_events`).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["AckBatcher", "Unsettled", "ack_frame", "frame_lock"]

#: how long acks wait for others before they are written
ACK_DELAY_S = 0.003
#: acks waiting at which they are written without waiting longer
ACK_BATCH_MAX = 64
_FRAME_END = b"\xce"
#: AMQP method frame (type 1) carrying basic.ack (class 60, method 80): tag, multiple bit
_ACK_HEADER = struct.Struct(">BHI")
_ACK_PAYLOAD = struct.Struct(">HHQB")


def ack_frame(channel_id: int, delivery_tag: int, multiple: bool = False) -> bytes:
    """The wire bytes of ``basic.ack`` on ``channel_id`` (what py-amqp writes for one)."""
    return (
        _ACK_HEADER.pack(1, channel_id, _ACK_PAYLOAD.size)
        + _ACK_PAYLOAD.pack(60, 80, delivery_tag, 1 if multiple else 0)
        + _FRAME_END
    )


def frame_lock(conn: Any) -> Any:
    """The lock py-amqp's frame writer holds while it writes a frame on ``conn`` (so that a
    batch's write and a frame from another thread do not interleave), or None when this
    py-amqp keeps none where we look; the batcher then writes acks the ordinary way."""
    writer = getattr(conn, "_frame_writer", None)
    for cell in getattr(writer, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, _LOCK_TYPES):
            return value
    return None


_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


class Unsettled:
    """The delivery tags of one channel incarnation not settled yet, oldest first.

    Tags arrive in increasing order on a channel, so insertion order is tag order. Guarded
    by a lock: deliveries arrive on the loop's thread, and a threads pool settles from its
    own."""

    __slots__ = ("_lock", "_tags")

    def __init__(self) -> None:
        self._tags: dict[int, None] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tags)

    def __contains__(self, tag: object) -> bool:
        return tag in self._tags

    def received(self, tag: int) -> None:
        self._tags[tag] = None

    def settled(self, tag: int, multiple: bool = False) -> None:
        with self._lock:
            if multiple:
                for old in [t for t in self._tags if t <= tag]:
                    del self._tags[old]
            else:
                self._tags.pop(tag, None)

    def clear(self) -> None:
        with self._lock:
            self._tags.clear()

    def take(self, acks: list[int]) -> tuple[int, list[int]]:
        """Settle ``acks``: returns the tag to ack with ``multiple`` (0 for none) and the
        tags to ack singly. The multiple ack covers the longest run of the oldest unsettled
        tags that are all in ``acks`` (two or more: one alone goes singly); none when a tag
        of ``acks`` is not unsettled here, as a multiple ack would then cover a tag the
        broker settled already."""
        wanted = set(acks)
        with self._lock:
            prefix: list[int] = []
            if all(tag in self._tags for tag in wanted):  # else: as asked, one by one
                for tag in self._tags:
                    if tag not in wanted:
                        break
                    prefix.append(tag)
            for tag in wanted:
                self._tags.pop(tag, None)
        if len(prefix) < 2:
            return 0, sorted(wanted)
        covered = set(prefix)
        return prefix[-1], sorted(wanted - covered)


class AckBatcher:
    """Acks made on the event loop's thread, written together a moment later (see the module).

    ``call_later(seconds, fn)``: the hub's (``call_soon`` for 0). ``on_error(channel, exc)``:
    what a failed write means for the channel's broker (the connection blames the link, as
    any failed ack would, and returns False; True asks for the acks one by one instead)."""

    def __init__(
        self,
        call_later: Callable[[float, Callable[[], None]], Any],
        on_error: Callable[[Any, BaseException], bool],
        delay_s: float = ACK_DELAY_S,
    ) -> None:
        self._call_later = call_later
        self.delay_s = delay_s
        self._waiting = 0
        self._on_error = on_error
        self._thread = threading.get_ident()
        #: channel -> tags to ack, in the order asked
        self._pending: dict[Any, list[int]] = {}
        self._scheduled = False
        #: frames written and writes made (for tests and benchmarks)
        self.frames = 0
        self.writes = 0

    def add(self, channel: Any, delivery_tag: int) -> bool:
        """Take an ack of ``channel`` for the batch; False when the caller must write it
        now (another thread's ack)."""
        if threading.get_ident() != self._thread:
            return False
        tags = self._pending.get(channel)
        if tags is None:
            tags = self._pending[channel] = []
        tags.append(delivery_tag)
        self._waiting += 1
        if self._waiting >= ACK_BATCH_MAX:
            self.flush()
        elif len(tags) >= len(channel.beetle_unsettled) and _window_full(channel):
            self.flush_channel(channel)  # nothing else to work on, and nothing more coming
        elif not self._scheduled:
            self._scheduled = True
            self._call_later(self.delay_s, self._on_timer)
        return True

    def on_its_thread(self) -> bool:
        """True when called on the event loop's thread, whose acks this batch takes."""
        return threading.get_ident() == self._thread

    def _on_timer(self) -> None:
        self._scheduled = False
        self.flush()

    def forget(self, channel: Any) -> None:
        """Drop the acks waiting for ``channel`` (closed and reopened: the broker gave the
        messages back)."""
        self._waiting -= len(self._pending.pop(channel, ()))

    def pending(self, channel: Any) -> list[int]:
        return list(self._pending.get(channel, ()))

    def flush_channel(self, channel: Any) -> None:
        """Write ``channel``'s waiting acks now (it is about to close)."""
        tags = self._pending.pop(channel, None)
        self._waiting -= len(tags or ())
        if tags and channel.connection is not None and channel.is_open:
            self._write_or_fail(channel.connection, [(channel, _acks(channel, tags))])

    def flush(self) -> None:
        """Write every waiting ack: one write per connection."""
        pending, self._pending = self._pending, {}
        self._waiting = 0
        by_conn: dict[Any, list[tuple[Any, list[tuple[int, bool]]]]] = {}
        for channel, tags in pending.items():
            conn = channel.connection
            if conn is None or not channel.is_open:
                logger.debug("beetle: dropping %d acks for a closed channel", len(tags))
                continue
            by_conn.setdefault(conn, []).append((channel, _acks(channel, tags)))
        for conn, parts in by_conn.items():
            self._write_or_fail(conn, parts)

    def _write_or_fail(self, conn: Any, parts: list[tuple[Any, list[tuple[int, bool]]]]) -> None:
        try:
            self._write(conn, parts)
        except Exception as exc:
            if self._on_error(parts[0][0], exc):
                _write_singly(parts)

    def _write(self, conn: Any, parts: list[tuple[Any, list[tuple[int, bool]]]]) -> None:
        lock = frame_lock(conn)
        if lock is None:  # write them the ordinary way, frame by frame
            _write_singly(parts)
            return
        frames = [
            ack_frame(channel.channel_id, tag, multiple)
            for channel, acks in parts
            for tag, multiple in acks
        ]
        with lock:
            conn.transport.write(b"".join(frames))
        conn.bytes_sent += len(frames)  # py-amqp's heartbeat counts frames sent
        self.frames += len(frames)
        self.writes += 1


def _window_full(channel: Any) -> bool:
    """Whether ``channel`` holds as many unsettled deliveries as its prefetch window allows
    (the limit :mod:`kombu_beetle.prefetch` set on it; none set: never full)."""
    wire = getattr(channel, "beetle_window", None)
    limit = (wire.channel_limit or wire.consumer_limit) if wire is not None else 0
    return bool(limit) and len(channel.beetle_unsettled) >= limit


def _acks(channel: Any, tags: list[int]) -> list[tuple[int, bool]]:
    """``(tag, multiple)`` for the acks of ``tags`` on ``channel``: the multiple one first."""
    multiple_tag, single = channel.beetle_unsettled.take(tags)
    acks = [(tag, False) for tag in single]
    if multiple_tag:
        acks.insert(0, (multiple_tag, True))
    return acks


def _write_singly(parts: list[tuple[Any, list[tuple[int, bool]]]]) -> None:
    for channel, acks in parts:
        for tag, multiple in acks:
            channel.beetle_write_ack(tag, multiple)
