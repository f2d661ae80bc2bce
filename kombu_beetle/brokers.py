"""One RabbitMQ broker as the transport sees it, and the set of them.

A :class:`BrokerLink` owns one py-amqp connection and knows whether the broker
is alive.  When an operation on it fails, the link is marked dead (its socket
is dropped, never waited on) and a background reviver reconnects it with
backoff; the main thread adopts the fresh connection at its next safe point.
So a broker that dies never costs a caller more than one failed operation.
"""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import amqp
from kombu.transport import pyamqp

from . import metrics
from .acks import AckBatcher, Unsettled
from .broker_log import BROKER_LOG
from .errors import BrokerTLSError
from .identity import client_properties
from .options import BeetleOptions, BrokerAddress
from .reader import BufferedTransport

logger = logging.getLogger(__name__)

#: errors that mean "this broker's connection is gone", as py-amqp reports them
LINK_ERRORS: tuple[type[BaseException], ...] = (
    *amqp.Connection.connection_errors,
    *amqp.Connection.recoverable_connection_errors,
    socket.timeout,
)

#: what a call on a broker catches and hands to :func:`fail_or_raise`: the link errors, and
#: ``AttributeError``, which py-amqp raises when a connection is torn down under it
#: (``'NoneType' object has no attribute 'write'`` once its transport is gone).  Only
#: :func:`is_link_error` may decide that such an error blames the broker.
CAUGHT_ERRORS: tuple[type[BaseException], ...] = (*LINK_ERRORS, AttributeError)


def torn_down(conn: Any) -> bool:
    """True when ``conn`` has lost its transport or socket (or was never there)."""
    if conn is None:
        return True
    transport = getattr(conn, "transport", None)
    return transport is None or getattr(transport, "sock", None) is None


def is_link_error(link: BrokerLink, exc: BaseException) -> bool:
    """Does ``exc`` mean that ``link``'s connection is gone?

    An ``AttributeError`` counts only when the connection really has been torn down:
    on a healthy connection it is a bug (ours or a caller's), and dropping a live broker
    for it would hide the bug behind a reconnect while the broker's deliveries are redone.
    """
    if isinstance(exc, AttributeError):
        return torn_down(link.conn)
    return isinstance(exc, LINK_ERRORS)


def fail_or_raise(link: BrokerLink, exc: BaseException) -> None:
    """Blame ``link`` for ``exc``, unless the broker is not at fault (then re-raise).

    Deliveries are dispatched while we wait on a broker, so an error from
    application code can surface here; it must reach the caller, and the
    broker must not be dropped for it.  The same goes for an ``AttributeError``
    on a connection that is still whole (see :func:`is_link_error`).
    """
    if getattr(exc, "_beetle_from_callback", False) or not is_link_error(link, exc):
        raise exc
    link.fail(exc)


class BrokerChannel(pyamqp.Channel):
    """A kombu pyamqp channel that never lets a dead broker's ack reach Celery.

    Deliveries are bound to the channel that delivered them, so acks go to the
    right broker.  If that broker died meanwhile, the ack is dropped: the broker
    redelivers the message, and the worker must not be restarted over it.
    """

    beetle_link: BrokerLink | None = None
    #: messages written by :meth:`~kombu_beetle.publish.Publisher.publish_many` on this
    #: channel: in confirm mode, the delivery tag of the last one
    beetle_sent: int = 0
    #: bumped each time the broker closes this channel (py-amqp reopens the same object
    #: under the same id, with delivery tags counted from 1 again): see :class:`Delivery`
    beetle_incarnation: int = 0

    #: the batcher of the event loop's acks (:mod:`kombu_beetle.acks`), when there is a loop
    beetle_acks: AckBatcher | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: delivery tags received and not settled yet (what makes a multiple ack safe)
        self.beetle_unsettled = Unsettled()
        super().__init__(*args, **kwargs)

    #: set when the broker closed this channel and py-amqp reopened it: open, but with no
    #: consumer and no prefetch (:meth:`~kombu_beetle.channel.BeetleChannel.reopen_closed`)
    beetle_revived: bool = False

    def _do_revive(self) -> None:
        self.beetle_revived = True
        self.beetle_incarnation += 1
        self.beetle_unsettled.clear()
        if self.beetle_acks is not None:
            self.beetle_acks.forget(self)
        super()._do_revive()

    def _on_basic_deliver(
        self,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        msg: Any,
    ) -> None:
        if consumer_tag not in (self.no_ack_consumers or ()):
            self.beetle_unsettled.received(delivery_tag)
        super()._on_basic_deliver(
            consumer_tag, delivery_tag, redelivered, exchange, routing_key, msg
        )

    def _on_get_ok(self, delivery_tag: int, *args: Any) -> Any:
        self.beetle_unsettled.received(delivery_tag)
        return super()._on_get_ok(delivery_tag, *args)

    def _link_call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        link = self.beetle_link
        if self.connection is None or not self.is_open:
            logger.debug("dropping %s on a closed channel of %s", method.__name__, link)
            return None
        try:
            return method(*args, **kwargs)
        except CAUGHT_ERRORS as exc:
            if link is not None:
                fail_or_raise(link, exc)
            elif isinstance(exc, AttributeError) and not torn_down(self.connection):
                raise
            return None

    def basic_ack(self, delivery_tag: int, multiple: bool = False, **kwargs: Any) -> Any:
        """On the event loop, the ack waits a moment and goes out in one write with the
        others (:mod:`kombu_beetle.acks`); elsewhere it is written now."""
        batch = self.beetle_acks
        if batch is not None and not multiple and not kwargs and batch.add(self, delivery_tag):
            return None
        return self.beetle_write_ack(delivery_tag, multiple, **kwargs)

    # A tag leaves the unsettled set only once its frame is written. A threads pool acks
    # from its own threads while the loop's batch may ack with ``multiple``: settled first,
    # a tag could be covered by a multiple ack written before its own frame, and the broker
    # would then close the channel on an "unknown delivery tag" (or take a requeue as an ack).

    def beetle_write_ack(self, delivery_tag: int, multiple: bool = False, **kwargs: Any) -> Any:
        """Write a ``basic.ack`` now."""
        try:
            return self._link_call(super().basic_ack, delivery_tag, multiple, **kwargs)
        finally:
            self.beetle_unsettled.settled(delivery_tag, multiple)

    def basic_reject(self, delivery_tag: int, requeue: bool = True, **kwargs: Any) -> Any:
        try:
            return self._link_call(super().basic_reject, delivery_tag, requeue, **kwargs)
        finally:
            self.beetle_unsettled.settled(delivery_tag)

    def basic_nack(
        self, delivery_tag: int, multiple: bool = False, requeue: bool = True, **kwargs: Any
    ) -> Any:
        try:
            return self._link_call(super().basic_nack, delivery_tag, multiple, requeue, **kwargs)
        finally:
            self.beetle_unsettled.settled(delivery_tag, multiple)

    def basic_recover(self, requeue: bool = False) -> Any:
        """The broker delivers again what this channel holds, under new tags: the old ones
        are not unsettled any more (a multiple ack must not count on them)."""
        if self.beetle_acks is not None:
            self.beetle_acks.flush_channel(self)
        self.beetle_unsettled.clear()
        return super().basic_recover(requeue)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        if self.beetle_acks is not None:  # acks asked for before the close go first
            self.beetle_acks.flush_channel(self)
        return super().close(*args, **kwargs)


class Delivery(pyamqp.Message):
    """A message bound to the incarnation of the broker channel that delivered it.

    A channel error (a declaration the broker refuses, say) closes the broker's channel and
    gives back everything delivered on it; py-amqp reopens the same channel object, whose
    delivery tags start from 1 again. An ack, reject or requeue of a delivery from before
    is not sent: the broker refuses an unknown tag by closing the channel again (and the
    error surfaces in whatever call waits next: a worker died of it in ``basic.qos``), and
    a tag that happens to be known again names another message. The broker redelivers the
    message; the dedup store decides what its copy does."""

    def __init__(self, msg: Any, channel: Any = None, **kwargs: Any) -> None:
        super().__init__(msg, channel, **kwargs)
        self.beetle_incarnation = getattr(channel, "beetle_incarnation", 0)

    def _stale(self, what: str, state: str) -> bool:
        if self.acknowledged or (
            getattr(self.channel, "beetle_incarnation", 0) == self.beetle_incarnation
        ):
            return False  # sent (or refused by kombu as settled twice)
        logger.debug(
            "beetle: not sending %s for delivery %s of %s: its channel was closed since "
            "(the broker gave the message back)",
            what,
            self.delivery_tag,
            getattr(self.channel, "beetle_link", None),
        )
        self._state = state
        return True

    def ack(self, multiple: bool = False) -> None:
        if not self._stale("ack", "ACK"):
            super().ack(multiple=multiple)

    def reject(self, requeue: bool = False) -> None:
        if not self._stale("reject", "REJECTED"):
            super().reject(requeue=requeue)

    def requeue(self) -> None:
        if not self._stale("requeue", "REQUEUED"):
            super().requeue()


def incarnation_of(raw: Any) -> int:
    """The incarnation of the channel ``raw`` (a py-amqp message) arrived on, for
    :func:`settle_raw`: taken as it arrives."""
    return int(getattr(raw.channel, "beetle_incarnation", 0))


def settle_raw(raw: Any, incarnation: int, requeue: bool | None = None) -> bool:
    """Ack (``requeue`` None) or reject a raw delivery that never became a :class:`Delivery`
    (one the connection's delivery filter held), with the same rule: nothing is sent once
    its channel was closed and reopened since (its tags count from 1 again, and the broker
    gave the message back). True when sent."""
    channel = raw.channel
    if getattr(channel, "beetle_incarnation", 0) != incarnation:
        logger.debug("beetle: not settling delivery %s: its channel was closed since", raw)
        return False
    if requeue is None:
        channel.basic_ack(raw.delivery_tag)
    else:
        channel.basic_reject(raw.delivery_tag, requeue=requeue)
    return True


class BrokerConnection(pyamqp.Connection):
    """py-amqp connection whose channels are :class:`BrokerChannel`, reading ahead over
    plain TCP (:class:`~kombu_beetle.reader.BufferedTransport`)."""

    Channel = BrokerChannel

    def Transport(  # py-amqp's name and signature
        self,
        host: str,
        connect_timeout: Any,
        ssl: Any = False,
        read_timeout: Any = None,
        write_timeout: Any = None,
        socket_settings: Any = None,
        **kwargs: Any,
    ) -> Any:
        if ssl:
            return super().Transport(
                host, connect_timeout, ssl, read_timeout, write_timeout,
                socket_settings=socket_settings, **kwargs,
            )  # fmt: skip
        return BufferedTransport(
            host,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            socket_settings=socket_settings,
            **kwargs,
        )


class BrokerLink:
    """One broker: its connection, liveness and reconnect schedule."""

    def __init__(
        self,
        address: BrokerAddress,
        options: BeetleOptions,
        *,
        consume_only: bool = False,
        on_dead: Callable[[BrokerLink], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self.name = address.name
        self.options = options
        self.consume_only = consume_only
        self.conn: BrokerConnection | None = None
        #: a connection the reviver made, waiting to be adopted by the main thread
        self.pending: BrokerConnection | None = None
        #: bumped on every adoption, so channels of an older connection are known stale
        self.generation = 0
        self.failures = 0
        self.next_retry_at = 0.0
        self.last_error: BaseException | None = None
        #: the broker's outages said when this connection was made (:mod:`.broker_log`)
        self.made_at = 0
        self._on_dead = on_dead
        self._clock = clock
        self._lock = threading.Lock()
        self._declaring: BrokerChannel | None = None

    def __repr__(self) -> str:
        return f"<BrokerLink {self.name} {'alive' if self.alive else 'dead'}>"

    @property
    def alive(self) -> bool:
        conn = self.conn
        return conn is not None and bool(conn.connected)

    def declaring_channel(self) -> BrokerChannel:
        """This connection's channel for declarations. A declaration the broker refuses (a
        queue that exists with other arguments, as during ``beetle queues migrate``; a
        passive one for a queue that is not there) closes the channel it came on, with
        every delivery held there: so declarations never go on a channel that consumes.
        py-amqp reopens it after such an error; a new connection gets a new one."""
        conn = self.conn
        if conn is None:
            raise amqp.RecoverableConnectionError(f"broker {self.name} is down")
        channel = self._declaring
        if channel is None or channel.connection is not conn or not channel.is_open:
            channel = self._declaring = conn.channel()
            channel.beetle_link = self
        return channel

    def connect(self) -> BrokerConnection:
        """Open a new AMQP connection to this broker (blocking, bounded by connect timeout)."""
        opts = self.options
        kwargs: dict[str, Any] = {
            "host": self.name,
            "userid": opts.userid,
            "password": opts.password,
            "virtual_host": opts.virtual_host,
            "connect_timeout": opts.connect_timeout_s,
            "heartbeat": opts.heartbeat_s,
            "login_method": "PLAIN",
        }
        kwargs.update(opts.amqp_options)
        kwargs.update(opts.broker_options.get(self.name, {}))
        kwargs["ssl"] = opts.ssl_for(self.address)
        kwargs["client_properties"] = client_properties(kwargs.get("client_properties"))
        conn = BrokerConnection(**kwargs)
        try:
            conn.connect()
        except ssl.SSLError as exc:
            _drop(conn)
            raise BrokerTLSError(self.name, exc) from exc
        except BaseException:
            _drop(conn)
            raise
        return conn

    def attach(self, conn: BrokerConnection) -> None:
        """Make ``conn`` this link's live connection (main thread)."""
        self.conn = conn
        self.generation += 1
        self.failures = 0
        self.last_error = None
        self.made_at = BROKER_LOG.up(self.name)
        logger.debug("beetle: broker %s is up (connection #%d)", self.name, self.generation)
        metrics.broker_up(self.name, reconnected=self.generation > 1)

    def adopt_pending(self) -> bool:
        with self._lock:
            conn, self.pending = self.pending, None
        if conn is None:
            return False
        if not conn.connected:
            self._schedule_retry()
            return False
        self.attach(conn)
        return True

    def offer(self, conn: BrokerConnection) -> None:
        """Called by the reviver thread with a fresh connection."""
        with self._lock:
            old, self.pending = self.pending, conn
        if old is not None:
            _drop(old)

    def fail(self, exc: BaseException | None) -> None:
        """Mark the broker dead: drop its socket now, retry later with backoff."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        self.last_error = exc
        BROKER_LOG.down(self.name, exc, self.made_at)
        metrics.broker_down(self.name)
        if self._on_dead is not None:
            self._on_dead(self)
        _drop(conn)
        self._schedule_retry()

    def _schedule_retry(self) -> None:
        self.failures += 1
        opts = self.options
        delay = min(
            opts.reconnect_interval_s * 2 ** (self.failures - 1), opts.reconnect_max_interval_s
        )
        self.next_retry_at = self._clock() + delay

    def due(self, now: float) -> bool:
        return self.conn is None and self.pending is None and now >= self.next_retry_at

    def close(self, graceful: bool = True) -> None:
        conn, self.conn = self.conn, None
        with self._lock:
            pending, self.pending = self.pending, None
        if pending is not None:
            _drop(pending)
        if conn is None:
            return
        if not graceful:
            _drop(conn)
            return
        try:
            conn.close()
        except Exception:
            _drop(conn)


def _drop(conn: amqp.Connection) -> None:
    """Abandon a connection without any handshake (the broker may be hung)."""
    try:
        conn.collect()
    except Exception:  # pragma: no cover - best effort on a dead socket
        pass


class BrokerSet:
    """The links of one transport connection, and which of them get a message."""

    def __init__(self, links: list[BrokerLink], strategy: str) -> None:
        self.links = links
        self.publishable = [link for link in links if not link.consume_only]
        self.strategy = strategy
        self._rr = itertools.count()

    def __iter__(self) -> Iterator[BrokerLink]:
        return iter(self.links)

    def live(self) -> list[BrokerLink]:
        return [link for link in self.links if link.alive]

    def candidates(self) -> list[BrokerLink]:
        """Live publishable brokers in the order a publish should try them.

        ``round_robin`` rotates the start so that load spreads; ``primary``
        always starts at the first live broker in URL order.
        """
        live = [link for link in self.publishable if link.alive]
        if self.strategy == "round_robin" and len(live) > 1:
            start = next(self._rr) % len(live)
            live = live[start:] + live[:start]
        return live

    def rotate(self, n: int) -> int:
        """A start index that moves on each call (fair reads across brokers)."""
        return next(self._rr) % n if n else 0

    def names(self) -> list[str]:
        return [link.name for link in self.publishable]
