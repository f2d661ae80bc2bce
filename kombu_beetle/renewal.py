"""A delivery published again, unchanged, to its queue on the broker that delivered it.

RabbitMQ counts the deliveries of a quorum queue's message (``x-delivery-count``): every
requeue, and every return when a channel closes (a worker restart, a consumer timeout).
Past the queue's ``delivery-limit`` (20 by default from RabbitMQ 4.0) the broker drops the
message, or dead-letters it when the queue has a dead-letter target. A consumer that can
tell copies of one message apart (the worker's dedup store can) replaces such a delivery by
a fresh copy, whose count starts again: :class:`SameBrokerPublisher` writes the copy and
waits for the broker's confirm; only then may the consumer ack the delivery.

Each broker gets a connection of its own for this. A confirm awaited on the consuming
connection would read that connection's deliveries inside the wait, and run them there.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import amqp

__all__ = ["DELIVERY_COUNT_HEADER", "SameBrokerPublisher", "delivery_count"]

#: set by quorum queues: how often the broker delivered the message before
DELIVERY_COUNT_HEADER = "x-delivery-count"

logger = logging.getLogger(__name__)

#: what a lost or refused connection raises here; the copy is then tried once more
_CONNECTION_ERRORS = (amqp.exceptions.AMQPError, OSError, socket.timeout)


def delivery_count(message: Any) -> int | None:
    """The broker's ``x-delivery-count`` of ``message`` (quorum queues), or None."""
    headers = getattr(message, "headers", None) or {}
    value = headers.get(DELIVERY_COUNT_HEADER) if isinstance(headers, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class SameBrokerPublisher:
    """Publishes copies of ``beetle://`` deliveries, each to the broker that delivered it.

    ``publish_again(message, queue, headers)`` returns once that broker confirmed the copy,
    and raises when it could not (the delivery is then left as it is). One connection per
    broker, opened on first use and again after an error.
    """

    def __init__(self, confirm_timeout_s: float = 5.0) -> None:
        self.confirm_timeout_s = confirm_timeout_s
        self._channels: dict[str, Any] = {}

    def publish_again(self, message: Any, queue: str, headers: dict[str, Any]) -> None:
        """Write ``message``'s body and properties with ``headers`` to ``queue`` (through
        the default exchange) on its broker, and wait for the confirm."""
        link = getattr(getattr(message, "channel", None), "beetle_link", None)
        if link is None:
            raise LookupError("not a beetle:// delivery: its broker is unknown")
        properties = {
            k: v
            for k, v in (message.properties or {}).items()
            if k not in ("application_headers", "delivery_info")
        }
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        copy = amqp.Message(body, application_headers=headers, **properties)
        for attempt in (1, 2):
            channel = self._channel(link)
            try:
                channel.basic_publish_confirm(
                    copy, exchange="", routing_key=queue, confirm_timeout=self.confirm_timeout_s
                )
                return
            except _CONNECTION_ERRORS:
                self._forget(link.name)
                if attempt == 2:
                    raise

    def close(self) -> None:
        for name in list(self._channels):
            self._forget(name)

    def _channel(self, link: Any) -> Any:
        channel = self._channels.get(link.name)
        if channel is None or not channel.is_open or not channel.connection:
            self._forget(link.name)
            channel = self._channels[link.name] = link.connect().channel()
        return channel

    def _forget(self, name: str) -> None:
        channel = self._channels.pop(name, None)
        connection = getattr(channel, "connection", None)
        if connection is None:
            return
        try:
            connection.close()
        except Exception as exc:  # a dead connection: nothing to close
            logger.debug("beetle: closing the renewal connection to %s: %r", name, exc)
