"""Acks in batches (kombu_beetle.acks): the pure parts, without a broker."""

from __future__ import annotations

from typing import Any

import amqp
import pytest
from amqp import spec
from amqp.serialization import dumps

from kombu_beetle.acks import AckBatcher, Unsettled, ack_frame, frame_lock


def test_an_ack_frame_is_the_bytes_py_amqp_writes_for_one() -> None:
    for tag, multiple in ((1, False), (7, True), (2**40 + 3, False)):
        args = dumps("Lb", (tag, multiple))
        payload = b"".join([spec.Basic.Ack[0].to_bytes(2, "big"), (80).to_bytes(2, "big"), args])
        expected = b"\x01" + (5).to_bytes(2, "big") + len(payload).to_bytes(4, "big")
        assert ack_frame(5, tag, multiple) == expected + payload + b"\xce"


def _unsettled(*tags: int) -> Unsettled:
    unsettled = Unsettled()
    for tag in tags:
        unsettled.received(tag)
    return unsettled


def test_acks_of_the_oldest_unsettled_deliveries_go_as_one_multiple_ack() -> None:
    unsettled = _unsettled(1, 2, 3, 4, 5)
    assert unsettled.take([3, 1, 2]) == (3, [])
    assert list(unsettled._tags) == [4, 5]


def test_a_held_delivery_stops_the_multiple_ack_and_the_rest_go_singly() -> None:
    unsettled = _unsettled(1, 2, 3, 4, 5, 6)
    # 3 is held (a countdown task): a multiple ack of 4 would settle it too
    assert unsettled.take([1, 2, 4, 5]) == (2, [4, 5])
    assert list(unsettled._tags) == [3, 6]
    assert unsettled.take([6]) == (0, [6])


def test_one_ack_alone_is_never_sent_as_multiple() -> None:
    unsettled = _unsettled(1, 2)
    assert unsettled.take([1]) == (0, [1])


def test_an_ack_of_a_tag_not_unsettled_here_turns_off_multiple_for_its_batch() -> None:
    unsettled = _unsettled(2, 3, 4)
    assert unsettled.take([1, 2, 3]) == (0, [1, 2, 3])


def test_settling_with_multiple_forgets_every_older_tag() -> None:
    unsettled = _unsettled(1, 2, 3, 4)
    unsettled.settled(3, multiple=True)
    assert list(unsettled._tags) == [4]


class _Channel:
    def __init__(self, conn: Any, channel_id: int = 1) -> None:
        self.connection = conn
        self.channel_id = channel_id
        self.is_open = True
        self.beetle_unsettled = Unsettled()
        self.written: list[tuple[int, bool]] = []

    def beetle_write_ack(self, tag: int, multiple: bool = False) -> None:
        self.written.append((tag, multiple))


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))


class _Conn:
    def __init__(self) -> None:
        import threading

        lock = threading.Lock()

        def write_frame(*args: Any) -> None:  # py-amqp's closure holds its lock
            with lock:
                pass

        self._frame_writer = write_frame
        self.lock = lock
        self.transport = _Transport()
        self.bytes_sent = 0


def _batcher() -> tuple[AckBatcher, list[Any]]:
    soon: list[Any] = []
    return AckBatcher(lambda seconds, fn: soon.append(fn), lambda channel, exc: False), soon


def test_acks_of_one_loop_pass_are_written_once_per_connection() -> None:
    conn = _Conn()
    first, second = _Channel(conn, 1), _Channel(conn, 2)
    for tag in (1, 2, 3):
        first.beetle_unsettled.received(tag)
        second.beetle_unsettled.received(tag)
    batcher, soon = _batcher()
    assert batcher.add(first, 1) and batcher.add(first, 2) and batcher.add(second, 3)
    assert len(soon) == 1  # one flush scheduled, a moment later
    assert conn.transport.writes == []  # nothing written before the pass ends
    soon.pop()()
    assert conn.transport.writes == [ack_frame(1, 2, True) + ack_frame(2, 3)]
    assert conn.bytes_sent == 2
    assert (batcher.writes, batcher.frames) == (1, 2)


def test_acks_of_a_channel_reopened_meanwhile_are_dropped() -> None:
    conn = _Conn()
    channel = _Channel(conn)
    channel.beetle_unsettled.received(1)
    batcher, soon = _batcher()
    batcher.add(channel, 1)
    batcher.forget(channel)  # BrokerChannel._do_revive: the broker gave the message back
    soon.pop()()
    assert conn.transport.writes == []


def test_acks_from_another_thread_are_left_to_the_caller() -> None:
    import threading

    batcher, _ = _batcher()
    taken: list[bool] = []
    thread = threading.Thread(target=lambda: taken.append(batcher.add(_Channel(_Conn()), 1)))
    thread.start()
    thread.join()
    assert taken == [False]


def test_a_batch_write_that_fails_without_blaming_the_broker_is_written_singly() -> None:
    conn = _Conn()
    channel = _Channel(conn)
    channel.beetle_unsettled.received(1)

    def broken(data: bytes) -> None:
        raise TypeError("a bug")

    conn.transport.write = broken  # type: ignore[method-assign]
    soon: list[Any] = []
    batcher = AckBatcher(lambda seconds, fn: soon.append(fn), lambda channel, exc: True)
    batcher.add(channel, 1)
    soon.pop()()
    assert channel.written == [(1, False)]


def test_the_frame_lock_is_found_in_py_amqps_frame_writer_from_5_4() -> None:
    # py-amqp 5.4 locks its frame writer; before it there is no lock, and acks are written
    # the ordinary way (one frame at a time from the loop's thread)
    conn = amqp.Connection("127.0.0.1:1")
    conn.frame_writer = amqp.method_framing.frame_writer(conn, _Transport())
    if tuple(amqp.VERSION[:2]) >= (5, 4):
        assert frame_lock(conn) is not None
    else:
        assert frame_lock(conn) is None
    assert frame_lock(object()) is None


@pytest.mark.parametrize("limit", ["channel_limit", "consumer_limit"])
def test_acks_are_written_at_once_when_the_prefetch_window_is_full(limit: str) -> None:
    """The window is full of acks waiting: the worker has nothing else of the channel, and the
    broker sends nothing more until an ack comes (with a window of one, every ack)."""
    from kombu_beetle.prefetch import WireWindow

    conn = _Conn()
    channel = _Channel(conn)
    channel.beetle_window = WireWindow(**{limit: 2})  # type: ignore[attr-defined]
    channel.beetle_unsettled.received(1)
    batcher, soon = _batcher()
    batcher.add(channel, 1)
    assert conn.transport.writes == [], "one of two slots taken: the ack waits for company"
    channel.beetle_unsettled.received(2)
    batcher.add(channel, 2)
    assert conn.transport.writes == [ack_frame(1, 2, True)], "the window is full: both go now"
    soon.pop()()  # the timer finds nothing left
    assert len(conn.transport.writes) == 1


def test_acks_wait_in_a_full_prefetch_window_while_a_delivery_of_it_is_still_held() -> None:
    """A busy worker: the window is full, but the delivery still held is work to do, and
    acks that wait a moment for company cost its broker fewer wake-ups."""
    from kombu_beetle.prefetch import WireWindow

    conn = _Conn()
    channel = _Channel(conn)
    channel.beetle_window = WireWindow(channel_limit=2)  # type: ignore[attr-defined]
    for tag in (1, 2):
        channel.beetle_unsettled.received(tag)
    batcher, soon = _batcher()
    batcher.add(channel, 2)
    assert conn.transport.writes == [], "1 is still held"
    soon.pop()()
    assert conn.transport.writes == [ack_frame(1, 2)]


def test_acks_are_written_at_once_when_many_wait() -> None:
    from kombu_beetle.acks import ACK_BATCH_MAX

    conn = _Conn()
    channel = _Channel(conn)
    batcher, soon = _batcher()
    for tag in range(1, ACK_BATCH_MAX + 1):
        channel.beetle_unsettled.received(tag)
        batcher.add(channel, tag)
    assert conn.transport.writes == [ack_frame(1, ACK_BATCH_MAX, True)]
    soon.pop()()  # the timer finds nothing left
    assert len(conn.transport.writes) == 1


@pytest.mark.parametrize(
    ("settle", "frame"),
    [
        ("beetle_write_ack", "basic_ack"),
        ("basic_reject", "basic_reject"),
        ("basic_nack", "basic_nack"),
    ],
)
def test_a_tag_settled_from_another_thread_stays_unsettled_until_its_frame_is_written(
    monkeypatch: pytest.MonkeyPatch, settle: str, frame: str
) -> None:
    """A threads pool acks from its own threads while the loop's batch may ack with
    ``multiple``: a multiple ack covering a tag whose own frame is not out yet would reach the
    broker first, and the broker would close the channel on the tag's "unknown delivery tag"
    (for a reject: take the requeue as an ack)."""
    from kombu.transport import pyamqp

    from kombu_beetle.brokers import BrokerChannel

    channel = BrokerChannel.__new__(BrokerChannel)
    channel.beetle_unsettled = Unsettled()
    channel.connection, channel.is_open, channel.beetle_link = object(), True, None
    for tag in (1, 2, 3):
        channel.beetle_unsettled.received(tag)
    batch_while_writing: list[tuple[int, list[int]]] = []

    def write(self: Any, tag: int, *args: Any, **kwargs: Any) -> None:
        # the loop's batch of acks for tags 2 and 3, taken while this thread writes tag 1
        batch_while_writing.append(self.beetle_unsettled.take([2, 3]))

    monkeypatch.setattr(pyamqp.Channel, frame, write, raising=False)
    getattr(channel, settle)(1)
    assert batch_while_writing == [(0, [2, 3])], "no multiple ack over a tag still being written"
    assert len(channel.beetle_unsettled) == 0
