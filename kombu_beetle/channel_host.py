"""What a channel and the connection it belongs to agree on, so neither imports the other back.

:class:`~kombu_beetle.connection.BeetleConnection` makes its channels
(:class:`~kombu_beetle.channel.BeetleChannel`) and keeps them: the connection imports the
channel. A channel reaches back to its connection for the broker set, the declarations to
replay, the ack batcher, a publisher and the delivery filter; :class:`ChannelHost` names
exactly those, and the channel imports this module, never the connection.

A consumer's delivery passes through :func:`tag_deliveries` on its way from a broker's
channel to kombu's callback: it gets kombu's consumer tag and its broker's name, and the
host's :data:`DeliveryFilter` (set by celery_beetle's gate) sees it first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from .acks import AckBatcher
from .brokers import BrokerChannel, BrokerLink, BrokerSet
from .declarations import DeclarationLog
from .options import BeetleOptions
from .publish import Publisher

__all__ = ["BROKER_HEADER", "ChannelHost", "DeliveryFilter", "tag_deliveries"]

logger = logging.getLogger(__name__)

#: the ``delivery_info`` key naming the broker a delivery came from
BROKER_HEADER = "beetle_broker"

#: ``filter(raw_message, consumer_tag, deliver) -> bool``: looks at each delivery before
#: kombu makes a ``Message`` of it (:attr:`ChannelHost.delivery_filter`). True means the
#: filter took it: it acks it, or calls ``deliver(raw)`` later to send it on as any
#: delivery. Redundant copies of a message that is already running in this worker cost a
#: dict lookup this way, not a kombu Message and a Celery strategy call.
DeliveryFilter = Callable[[Any, str, Callable[[Any], Any]], bool]


class ChannelHost(Protocol):
    """What a :class:`~kombu_beetle.channel.BeetleChannel` uses of its connection."""

    options: BeetleOptions
    brokers: BrokerSet
    declarations: DeclarationLog
    #: made when the connection joins an event loop (None: acks go at once)
    ack_batcher: AckBatcher | None
    #: sees each delivery before kombu does (None: none)
    delivery_filter: DeliveryFilter | None

    def maintain(self) -> None:
        """Adopt brokers that came back (cheap when none did)."""

    def publisher_for(self, sub_for: Callable[[BrokerLink], BrokerChannel]) -> Publisher:
        """A publisher over the host's brokers, on the channels ``sub_for`` gives."""

    def remove_channel(self, channel: Any) -> None:
        """Forget a channel that closed."""

    def reopen_closed(self, link: BrokerLink) -> None:
        """Give every channel whose channel on ``link`` the broker closed a new one."""


def tag_deliveries(callback: Any, tag: str, host: ChannelHost | None = None) -> Any:
    """Mark exceptions from a consumer callback, so they are not taken for a broker failure.

    Each delivery carries the consumer tag kombu consumed with (``tag``), not the one its
    broker knows: the prefetch window consumes again under fresh tags (``tag.N``), and the
    worker recognises a queue's deliveries by kombu's tag (the gate's queue, a hand-back).
    The host's :data:`DeliveryFilter`, if one is set, sees the delivery first."""
    if callback is None:
        return None

    def deliver_on(message: Any) -> Any:
        try:
            return callback(message)
        except BaseException as exc:
            try:
                exc._beetle_from_callback = True  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            raise

    def deliver(message: Any) -> Any:
        info = getattr(message, "delivery_info", None)
        if info is not None:
            if info.get("consumer_tag") != tag:
                info["consumer_tag"] = tag
            link = getattr(getattr(message, "channel", None), "beetle_link", None)
            if link is not None:
                info[BROKER_HEADER] = link.name
            held = getattr(host, "delivery_filter", None)
            if held is not None and _filtered(held, message, tag, deliver_on):
                return None
        return deliver_on(message)

    return deliver


def _filtered(held: DeliveryFilter, message: Any, tag: str, deliver_on: Any) -> bool:
    try:
        return held(message, tag, deliver_on)
    except Exception:  # the filter only saves work: the delivery goes on as any other
        logger.exception("beetle: the delivery filter failed; delivering the message on")
        return False
