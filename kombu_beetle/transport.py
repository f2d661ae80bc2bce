"""beetle: a kombu transport over N independent RabbitMQ brokers.

Features
========
* Type: Native (composes py-amqp connections, one per broker)
* Supports Direct, Topic, Fanout and Headers exchanges, TTL, priorities
* Redundant messages are published to two brokers with publisher confirms
* Consumes every queue from every broker; survives brokers dying and returning

Connection String
=================
.. code-block::

    beetle://USER:PASSWORD@HOST1:PORT1,HOST2:PORT2[,...]/VHOST?option=value

Credentials and vhost apply to every broker.  ``;`` stays kombu's failover
separator, so brokers are comma-separated inside one URL.

Transport Options
=================
In the URL query or ``broker_transport_options`` (the latter wins):

* ``redundancy`` (2): copies of a redundant message, on distinct brokers; one set above the
  number of brokers in the URL is refused.
* ``publish_strategy`` (``round_robin``): or ``primary``, every non-redundant
  message to the first live broker in URL order (keeps one queue's order).
* ``confirm_publish`` (true), ``confirm_timeout`` (5 s): publisher confirms;
  the timeout also bounds every blocking call on a hung broker.
* ``connect_timeout`` (4 s), ``reconnect_interval`` (1 s),
  ``reconnect_max_interval`` (30 s): reconnection of dead brokers, with backoff.
* ``redundant_queues``: routing keys (queue names) always published redundantly.
* ``message_ttl`` (86400 s): default ``x-beetle-expires-at`` of redundant messages.
* ``max_message_bytes`` (16777216, 16 MiB, RabbitMQ 4.0's ``max_message_size``):
  a larger body is refused before it is sent, with ``MessageTooLarge`` (a
  ``ValueError``: not retried, no broker blamed).  Raise it together with the
  brokers' ``max_message_size``; RabbitMQ 3.x does not tell clients its limit.
* ``additional_subscription_brokers``: ``host:port,...`` consumed from, never
  published to (draining an old broker).
* ``ssl`` (off): ``1``, or py-amqp's dict (``ca_certs``, ``certfile``, ``keyfile``,
  ...; Celery's ``broker_use_ssl`` too).  Brokers without a port then get 5671,
  and each broker's certificate must name that broker's host as written in the
  URL (``server_hostname`` per broker); a failed handshake raises
  ``BrokerTLSError`` naming the broker.
* ``broker_options``: ``{"host:port": {py-amqp Connection kwargs}}`` per broker,
  ``ssl`` included.
* ``trace_dir``: directory for JSON-lines trace events (off by default).
* py-amqp ``Connection`` options (``read_timeout``, ``socket_settings``, ...)
  pass through.
"""

from __future__ import annotations

from typing import Any

import amqp
from kombu.transport import base

from .channel import BeetleChannel
from .connection import BeetleConnection
from .errors import NoBrokerAvailable, PublishNotConfirmed
from .options import BeetleOptions, build_options
from .urls import mask_url


class Transport(base.Transport):
    """The ``beetle://`` transport: N brokers behind one kombu connection."""

    Connection = BeetleConnection
    Channel = BeetleChannel

    default_port = 5672  # type: ignore[assignment]
    default_ssl_port = 5671
    #: kombu must hand us the whole URL: its parser knows one host only
    can_parse_url = True

    connection_errors = (*amqp.Connection.connection_errors, NoBrokerAvailable)
    channel_errors = amqp.Connection.channel_errors
    recoverable_connection_errors = (
        *amqp.Connection.recoverable_connection_errors,
        NoBrokerAvailable,
        PublishNotConfirmed,
    )
    recoverable_channel_errors = amqp.Connection.recoverable_channel_errors

    driver_name = "beetle"
    driver_type = "amqp"
    implements = base.Transport.implements.extend(
        asynchronous=True,
        heartbeats=True,
        exchange_type=frozenset(["direct", "topic", "fanout", "headers"]),
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        self.client = client
        # parse now, so that a malformed URL fails when the connection is made
        self.options = self._build_options()

    def _build_options(self) -> BeetleOptions:
        client: Any = self.client
        return build_options(
            client.hostname or "beetle://",
            client.transport_options,
            ssl=client.ssl,
            connect_timeout_s=client.connect_timeout,
            heartbeat_s=client.heartbeat,
            userid=client.userid,
            password=client.password if not callable(client.password) else client.password(),
        )

    def driver_version(self) -> str:
        return str(amqp.__version__)

    def establish_connection(self) -> BeetleConnection:
        return BeetleConnection(self._build_options(), client=self.client).connect()

    def create_channel(self, connection: BeetleConnection) -> BeetleChannel:
        return connection.channel()

    def close_channel(self, channel: BeetleChannel) -> None:
        channel.close()

    def drain_events(self, connection: BeetleConnection, **kwargs: Any) -> None:
        connection.drain_events(**kwargs)

    def close_connection(self, connection: BeetleConnection) -> None:
        connection.client = None
        connection.close()

    def _collect(self, connection: BeetleConnection | None) -> None:
        if connection is not None:
            connection.collect()

    def verify_connection(self, connection: BeetleConnection) -> bool:
        return connection.connected

    def get_heartbeat_interval(self, connection: BeetleConnection) -> float:
        return connection.heartbeat

    def register_with_event_loop(self, connection: BeetleConnection, loop: Any) -> None:
        connection.register_with_event_loop(loop)

    def heartbeat_check(self, connection: BeetleConnection, rate: int = 2) -> None:
        connection.heartbeat_tick(rate=rate)

    def qos_semantics_matches_spec(self, connection: BeetleConnection) -> bool:
        """False: a prefetch change reaches the running consumers (Celery's "global QoS"),
        on classic and quorum queues alike, on every RabbitMQ version. The channel applies
        Celery's count channel-wide where it may, and per consumer, consuming again, where
        it may not (``kombu_beetle.prefetch``); it does not follow Celery's ``global``
        flag. So Celery widens the window for the countdown/ETA tasks it holds, and reduces
        it after a reconnect and widens it back, as on pyamqp with RabbitMQ 3.x."""
        return False

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        return uri if include_password else mask_url(uri, mask)

    @property
    def default_connection_params(self) -> dict[str, Any]:
        return {}
