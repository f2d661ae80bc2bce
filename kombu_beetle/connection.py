"""The transport-level connection: N broker links behind one kombu connection.

Kombu and Celery see one connection object.  Behind it every broker has its
own py-amqp connection; a broker that fails is dropped from the set (and from
Celery's event loop) and reconnected in the background, so the Celery consumer
is never restarted while at least one broker is alive.
"""

from __future__ import annotations

import errno
import logging
import select
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any

from .acks import AckBatcher
from .broker_log import BROKER_LOG
from .brokers import (
    CAUGHT_ERRORS,
    BrokerChannel,
    BrokerLink,
    BrokerSet,
    fail_or_raise,
    is_link_error,
)
from .channel import CHANNEL_ERRORS, BeetleChannel
from .channel_host import DeliveryFilter
from .declarations import declarations_of
from .errors import NoBrokerAvailable
from .options import BeetleOptions
from .publish import Publisher
from .reader import BufferedTransport, read_available
from .reviver import Reviver
from .trace import Tracer, get_tracer

logger = logging.getLogger(__name__)

#: how often the event loop adopts revived brokers, seconds
MAINTAIN_INTERVAL_S = 0.2
_UNAVAILABLE = (errno.EAGAIN, errno.EINTR)


def from_callback(exc: BaseException) -> bool:
    """True when ``exc`` was raised by a consumer callback, not by a broker socket."""
    return getattr(exc, "_beetle_from_callback", False)


class BeetleConnection:
    """Looks like one py-amqp connection to kombu; owns one link per broker."""

    def __init__(
        self,
        options: BeetleOptions,
        client: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.client = client
        self._clock = clock
        consume_only = set(options.all_brokers) - set(options.brokers)
        links = [
            BrokerLink(
                address,
                options,
                consume_only=address in consume_only,
                on_dead=self._on_link_dead,
                clock=clock,
            )
            for address in options.all_brokers
        ]
        self.brokers = BrokerSet(links, options.publish_strategy)
        self.declarations = declarations_of(client)
        self.channels: list[BeetleChannel] = []
        #: sees each delivery before kombu does (:data:`kombu_beetle.channel_host.DeliveryFilter`;
        #: celery_beetle's gate sets it to hold the copies of messages running here)
        self.delivery_filter: DeliveryFilter | None = None
        self._reviver = Reviver(links, clock=clock)
        #: acks made on the event loop, written once per loop pass (:mod:`kombu_beetle.acks`)
        self.ack_batcher: AckBatcher | None = None
        self._loop: Any = None
        self._readers: dict[BrokerLink, Any] = {}
        self._timer: Any = None
        self._closed = False
        self._next_channel_id = 1
        self._rotation = 0

    # -- lifecycle ---------------------------------------------------------------

    def connect(self) -> BeetleConnection:
        """Connect to every broker in parallel; at least one must answer."""
        links = list(self.brokers)
        with ThreadPoolExecutor(max_workers=len(links)) as pool:
            results = list(pool.map(_try_connect, links))
        for link, result in zip(links, results, strict=False):
            if isinstance(result, BaseException):
                link.last_error = result
                link._schedule_retry()
                BROKER_LOG.down(link.name, result)
            else:
                link.attach(result)
                # as for a broker that comes back: a connection kombu made again (its retry
                # after a connection error) declares what the one before declared
                self._on_link_up(link)
        if not self.brokers.live():
            reasons = "; ".join(f"{link.name}: {link.last_error!r}" for link in links)
            raise NoBrokerAvailable([link.name for link in links], reasons)
        if len(self.brokers.live()) < len(links):
            self._reviver.wake()
        return self

    @property
    def connected(self) -> bool:
        """True until closed, even while every broker is down.

        The reviver brings brokers back and replays this connection's state on them; if kombu
        saw ``False`` it would build a second connection (under Celery's consumer, through the
        heartbeat check) and abandon this one with its consumers.  A publish with no broker
        alive raises :class:`NoBrokerAvailable`, which kombu's retry policy handles.
        """
        return not self._closed

    def close(self) -> None:
        self._shutdown(graceful=True)

    def collect(self) -> None:
        self._shutdown(graceful=False)

    def _shutdown(self, graceful: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self.ack_batcher is not None and graceful:
            self.ack_batcher.flush()
        self._reviver.stop()
        if self._timer is not None:
            self._timer.cancel()
        for link in list(self._readers):
            self._remove_reader(link)
        for channel in list(self.channels):
            channel.forget_all(graceful=graceful)
        self.channels.clear()
        for link in self.brokers:
            # a graceful close waits for the broker's close-ok, bounded by the socket timeout
            link.close(graceful=graceful and link.alive)

    @cached_property
    def tracer(self) -> Tracer:
        """Trace events of this process (a no-op unless ``trace_dir`` is set)."""
        return get_tracer(self.options.trace_dir, role="publisher")

    def publisher_for(self, sub_for: Callable[[BrokerLink], BrokerChannel]) -> Publisher:
        """A publisher over this connection's brokers, on the channels ``sub_for`` gives."""
        return Publisher(self.options, self.brokers, self.tracer, sub_for, self.maintain)

    # -- channels ------------------------------------------------------------------

    def channel(self) -> BeetleChannel:
        if self._closed:
            raise NoBrokerAvailable(self.brokers.names(), "connection already closed")
        channel = BeetleChannel(self, self._next_channel_id)
        self._next_channel_id += 1
        self.channels.append(channel)
        return channel

    def remove_channel(self, channel: BeetleChannel) -> None:
        if channel in self.channels:
            self.channels.remove(channel)

    # -- liveness ------------------------------------------------------------------

    def maintain(self) -> None:
        """Adopt brokers the reviver brought back (main thread; cheap when none)."""
        if self._closed:
            if self._timer is not None:
                self._timer.cancel()
            return
        for link in self.brokers:
            if link.pending is not None and link.adopt_pending():
                self._on_link_up(link)
        for channel in self.channels:
            channel.reconsume_due()

    def _on_link_up(self, link: BrokerLink) -> None:
        """A broker connected: bound its socket, declare the log on it (it may have come back
        without what was declared), and let every channel consume from it."""
        try:
            self._prepare_socket(link)
            self.declarations.replay(link)
            for channel in self.channels:
                channel.attach(link)
        except CAUGHT_ERRORS as exc:
            fail_or_raise(link, exc)
            return
        if self._loop is not None:
            self._add_reader(link)

    def _on_link_dead(self, link: BrokerLink) -> None:
        self._remove_reader(link)
        for channel in self.channels:
            channel.detach(link)
        if not self._closed:
            self._reviver.wake()

    def _prepare_socket(self, link: BrokerLink) -> None:
        """Bound every blocking call on this broker, so a hung broker cannot hang us."""
        assert link.conn is not None
        link.conn.transport.raise_on_initial_eintr = True
        link.conn.sock.settimeout(self.options.confirm_timeout_s)

    # -- reading -------------------------------------------------------------------

    def drain_events(self, timeout: float | None = None) -> None:
        """Process one event from any broker; raise ``socket.timeout`` after ``timeout``.

        On the event loop's own thread a timeout does not wait: what has arrived is handled,
        and the loop itself waits for the sockets. A wait there would hold the loop's timers
        and callbacks, the early acks of bodies just begun among them, while a broker whose
        prefetch window those acks fill sends nothing that would end it (Celery's worker
        drains so, for up to 0.1 s, as its loop begins; :mod:`kombu_beetle.acks`). Acks
        batched on that thread are written first."""
        batcher = self.ack_batcher
        if batcher is not None and batcher.on_its_thread():
            batcher.flush()
            if timeout is not None:
                timeout = 0.0
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            self.maintain()
            live = self.brokers.live()
            if len(live) > 1:
                # rotate so that a busy broker cannot starve the others
                self._rotation = (self._rotation + 1) % len(live)
                live = live[self._rotation :] + live[: self._rotation]
            remaining = None if deadline is None else max(0.0, deadline - self._clock())
            wait = MAINTAIN_INTERVAL_S if remaining is None else min(remaining, MAINTAIN_INTERVAL_S)
            ready = [link for link in live if _buffered(link)]
            if not ready and live:
                socks = {link.conn.sock: link for link in live if link.conn is not None}
                try:
                    readable, _, _ = select.select(list(socks), [], [], wait)
                except (OSError, ValueError):
                    readable = []
                ready = [socks[s] for s in readable]
            elif not live:
                time.sleep(wait)
            for link in ready:
                if self._read_one(link):
                    return
            if deadline is not None and self._clock() >= deadline:
                raise TimeoutError("timed out")

    def _read_one(self, link: BrokerLink) -> bool:
        conn = link.conn
        if conn is None:
            return False
        try:
            conn.drain_events(timeout=0)
        except TimeoutError:
            return False
        except OSError as exc:
            if exc.errno in _UNAVAILABLE and not from_callback(exc):
                return False
            fail_or_raise(link, exc)
            return False
        except CAUGHT_ERRORS as exc:
            fail_or_raise(link, exc)
            return False
        except CHANNEL_ERRORS as exc:
            self._channel_closed(link, exc)
            return False
        return True

    # -- Celery's event loop (kombu hub) -------------------------------------------

    def register_with_event_loop(self, loop: Any) -> None:
        self._loop = loop
        if self.ack_batcher is None:
            self.ack_batcher = AckBatcher(self._call_later, self._ack_failed)
            for channel in self.channels:
                for sub in channel.broker_channels():
                    sub.beetle_acks = self.ack_batcher
        for link in self.brokers.live():
            self._add_reader(link)
        if self._timer is None:
            self._timer = loop.call_repeatedly(MAINTAIN_INTERVAL_S, self.maintain)

    def _add_reader(self, link: BrokerLink) -> None:
        if link.conn is None or self._loop is None:
            return
        self._remove_reader(link)
        sock = link.conn.sock
        self._readers[link] = sock
        self._loop.add_reader(sock, self._on_readable, link, link.generation)

    def _remove_reader(self, link: BrokerLink) -> None:
        sock = self._readers.pop(link, None)
        if sock is not None and self._loop is not None:
            try:
                self._loop.remove(sock)
            except (OSError, ValueError, KeyError):
                pass

    def _on_readable(self, link: BrokerLink, generation: int) -> None:
        # Read until the socket is empty: frames already read into py-amqp's
        # buffers would otherwise wait for the next wake-up, perhaps forever.
        if link.generation != generation or not link.alive:
            return
        more = (
            self._read_available(link)
            if isinstance(getattr(link.conn, "transport", None), BufferedTransport)
            else self._read_one(link)
        )
        if more and self._loop is not None:
            self._loop.call_soon(self._on_readable, link, generation)

    def _read_available(self, link: BrokerLink) -> bool:
        """Every complete frame the broker sent (:func:`~kombu_beetle.reader.read_available`);
        True when frames are left for the next loop pass. Errors as :meth:`_read_one`; when a
        consumer's callback raises, the frames read after its own still get a pass (the
        socket will not say "readable" for them)."""
        conn = link.conn
        try:
            return read_available(conn)
        except OSError as exc:
            if exc.errno in _UNAVAILABLE and not from_callback(exc):
                return False
            self._pass_for_the_rest(link, conn)
            fail_or_raise(link, exc)
        except CAUGHT_ERRORS as exc:
            self._pass_for_the_rest(link, conn)
            fail_or_raise(link, exc)
        except CHANNEL_ERRORS as exc:
            self._pass_for_the_rest(link, conn)
            self._channel_closed(link, exc)
        except BaseException:
            self._pass_for_the_rest(link, conn)
            raise
        return False

    def _channel_closed(self, link: BrokerLink, exc: BaseException) -> None:
        """The broker closed a channel on ``link`` while we read (a delivery held unacked
        past its ``consumer_timeout``, say): the connection stays, the channel's deliveries
        go back to their queues, and its consumers start again on a new channel. An error
        a consumer's callback raised is the caller's, and goes on up."""
        if from_callback(exc):
            raise exc
        logger.warning(
            "beetle: %s closed a channel (%s); its unacked deliveries go back to their "
            "queues, and its consumers start again",
            link.name,
            exc,
        )
        self.reopen_closed(link)

    def reopen_closed(self, link: BrokerLink) -> None:
        """Give every channel whose channel on ``link`` the broker closed a new one."""
        for channel in list(self.channels):
            channel.reopen_closed(link)

    def _pass_for_the_rest(self, link: BrokerLink, conn: Any) -> None:
        transport = getattr(conn, "transport", None)
        if (
            self._loop is not None
            and link.conn is conn
            and isinstance(transport, BufferedTransport)
            and transport.frame_buffered()
        ):
            self._loop.call_soon(self._on_readable, link, link.generation)

    def _call_later(self, seconds: float, fn: Callable[[], None]) -> Any:
        loop = self._loop
        return loop.call_soon(fn) if seconds <= 0 else loop.call_later(seconds, fn)

    @staticmethod
    def _ack_failed(channel: BrokerChannel, exc: BaseException) -> bool:
        """A batch of acks could not be written: the broker's connection is gone (its
        messages come back), or True is returned for an error that does not blame it, and
        the batch writes them one by one as py-amqp would."""
        link = channel.beetle_link
        if link is not None and is_link_error(link, exc):
            link.fail(exc)
            return False
        logger.error("beetle: a batch of acks failed (%r); writing them one by one", exc)
        return True

    # -- heartbeats and server info -------------------------------------------------

    def heartbeat_tick(self, rate: int = 2) -> None:
        for link in self.brokers.live():
            try:
                link.conn.heartbeat_tick(rate=rate)  # type: ignore[union-attr]
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)

    @property
    def heartbeat(self) -> float:
        beats = [link.conn.heartbeat for link in self.brokers.live()]  # type: ignore[union-attr]
        return min(beats) if beats else self.options.heartbeat_s

    @property
    def server_properties(self) -> dict[str, Any]:
        for link in self.brokers.live():
            return link.conn.server_properties  # type: ignore[union-attr]
        return {}


def _try_connect(link: BrokerLink) -> Any:
    try:
        return link.connect()
    except Exception as exc:
        return exc


def _buffered(link: BrokerLink) -> bool:
    """Bytes already decrypted by TLS, or read ahead (:mod:`kombu_beetle.reader`), are
    invisible to select(); look for them (a whole frame: a part waits for the rest)."""
    conn = link.conn
    transport = getattr(conn, "transport", None)
    if isinstance(transport, BufferedTransport):
        return transport.frame_buffered()
    sock = getattr(conn, "sock", None)
    pending = getattr(sock, "pending", None)
    try:
        return bool(pending and pending())
    except (OSError, ValueError):
        return False
