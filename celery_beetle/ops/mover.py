"""Moving a queue's messages to another queue on one broker, acked only once confirmed.

What a RabbitMQ shovel with ``ack-mode: on-confirm`` does, done by the migration tool itself
over one AMQP connection: take a message from the source (``basic.get``), publish it to the
target through the default exchange with publisher confirms, and ack it at the source only
once the broker confirmed the copy. A crash between the confirm and the ack leaves the
message in both queues; a queue migration makes both share one dedup scope, so a BeetleTask
still runs once (a plain task, with no dedup, would run twice: see the README).

The message is copied as it was (body, properties, headers), except for the quorum queue's
``x-delivery-count``, which counts deliveries from the *source*: the target counts its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import amqp

from kombu_beetle.identity import client_properties
from kombu_beetle.options import BeetleOptions, BrokerAddress

__all__ = ["BrokerSession", "open_session"]

logger = logging.getLogger(__name__)

#: headers the broker sets on a delivery that must not travel with a moved copy
_BROKER_HEADERS = ("x-delivery-count",)


@dataclass
class BrokerSession:
    """One AMQP connection to one broker, with a confirming channel."""

    name: str
    connection: Any
    channel: Any

    def close(self) -> None:
        try:
            self.connection.close()
        except Exception as exc:  # closing after a failure: nothing left to save
            logger.debug("beetle: closing %s: %r", self.name, exc)

    def reopen(self) -> None:
        """A channel error (404, 406) closed the channel: open another."""
        if not self.channel.is_open:
            self.channel = _confirming_channel(self.connection)

    def fresh_channel(self) -> None:
        """A new channel, for a queue re-created under the same name: RabbitMQ 3.10 closes
        the connection (541 INTERNAL_ERROR) when a channel that used the old queue
        publishes to a new one of another type."""
        try:
            self.channel.close()
        except amqp.ChannelError:
            pass
        self.channel = _confirming_channel(self.connection)

    def consumers(self, queue: str) -> int | None:
        """Consumers of ``queue`` now, or None when it does not exist."""
        try:
            ok = self.channel.queue_declare(queue=queue, passive=True)
        except amqp.NotFound:
            self.reopen()
            return None
        return int(ok.consumer_count)

    def depth(self, queue: str) -> int | None:
        """Ready messages in ``queue``, or None when it does not exist."""
        try:
            ok = self.channel.queue_declare(queue=queue, passive=True)
        except amqp.NotFound:
            self.reopen()
            return None
        return int(ok.message_count)

    def move(self, source: str, target: str, limit: int | None = None) -> int:
        """Move ready messages from ``source`` to ``target`` until ``source`` is empty (or
        ``limit`` moved); returns how many. A missing source moves nothing; a missing
        target raises (an unroutable copy would be confirmed, then its original acked)."""
        if self.depth(target) is None:
            raise LookupError(f"{self.name}: queue {target!r} does not exist; nothing moved")
        moved = 0
        while limit is None or moved < limit:
            try:
                message = self.channel.basic_get(queue=source, no_ack=False)
            except amqp.NotFound:
                self.reopen()
                return moved
            if message is None:
                return moved
            properties = dict(message.properties)
            headers = dict(properties.pop("application_headers", None) or {})
            for name in _BROKER_HEADERS:
                headers.pop(name, None)
            copy = amqp.Message(message.body, application_headers=headers, **properties)
            # with confirms on, basic_publish returns once the broker has the copy
            returned: list[Any] = []
            on_return = _collector(returned)
            self.channel.events["basic_return"].add(on_return)
            try:
                self.channel.basic_publish(copy, exchange="", routing_key=target, mandatory=True)
            finally:
                self.channel.events["basic_return"].discard(on_return)
            if returned:  # deleted under us: keep the original, unacked (it goes back)
                raise LookupError(f"{self.name}: {target!r} returned a moved message")
            self.channel.basic_ack(message.delivery_tag)
            moved += 1
        return moved


def open_session(options: BeetleOptions, broker: BrokerAddress) -> BrokerSession:
    """Connect to ``broker`` as the transport would (credentials, vhost, TLS)."""
    connection = amqp.Connection(
        host=broker.name,
        userid=options.userid,
        password=options.password,
        virtual_host=options.virtual_host,
        connect_timeout=options.connect_timeout_s,
        ssl=options.ssl_for(broker),
        client_properties=client_properties({"connection_name": "beetle queues migrate"}),
        confirm_publish=True,
    )
    connection.connect()
    return BrokerSession(broker.name, connection, _confirming_channel(connection))


def _collector(into: list[Any]) -> Callable[..., None]:
    def collect(*args: Any) -> None:
        into.append(args)

    return collect


def _confirming_channel(connection: Any) -> Any:
    channel = connection.channel()
    channel.confirm_select()
    channel._confirm_selected = True
    return channel
