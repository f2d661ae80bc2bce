"""Celery's prefetch window on every broker channel, applied so that it can change while
consumers run.

A Celery worker widens its prefetch by one for each countdown/ETA task it holds and for each
copy the gate defers (``qos.increment_eventually``), narrows it again when they go, and sends
``basic.qos`` with the new count. RabbitMQ applies a channel-wide (``global``) prefetch to
the running consumers at once, but a per-consumer one only to consumers started after it: on
a per-consumer prefetch, held tasks keep their slots and tasks due now wait behind them (8
held countdown copies per broker stopped 100 immediate tasks until the countdowns were due).
So the count Celery asks for is applied, per broker channel, in one of two ways (Celery's
``global`` flag is not followed, only its count):

* **Channel-wide** (``basic.qos global=True``, consumers started with no per-consumer limit),
  where every queue the channel consumes was declared by this connection as a classic queue
  and the broker is RabbitMQ 3.3 to 3.x: what a pyamqp worker gets there. A change is one
  ``basic.qos`` per broker.
* **Per consumer, applied by consuming again**, everywhere else: a quorum queue, or a queue
  whose type this connection cannot vouch for (the brokers hold it with other arguments than
  declared, as after ``beetle queues migrate``; its consumer was cancelled by its broker; it
  was never declared here), and RabbitMQ 4 (where global QoS is deprecated). RabbitMQ
  refuses a quorum consumer on a channel with a channel-wide limit, with a per-consumer limit
  set too or not: ``540 NOT_IMPLEMENTED`` closes the broker's whole connection (measured on
  3.10). A changed count is applied by ``basic.cancel`` and ``basic.consume`` again on the
  same channel, under a fresh consumer tag: the deliveries held under the old tag stay with
  the channel and are acked there as before (measured, both queue types). A fresh tag, not
  the old one: on a quorum queue, consuming again under the tag just cancelled closes the
  connection (``541 INTERNAL_ERROR`` on 3.10), and on a classic queue the old deliveries'
  acks would add to the new consumer's credit, so the window would creep up. The cost: the
  deliveries held under older tags do not count against the new window until they are
  settled (the window is exceeded by at most what is held), and each change costs a
  ``basic.qos`` plus a cancel and a consume per consumer per broker.

A channel switches from channel-wide to per consumer when it starts consuming a queue it
cannot vouch for (the channel-wide limit is lifted first, with ``basic.qos global=True`` and
a count of 0, which RabbitMQ takes as none); it never switches back while it runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kombu.utils.text import version_string_as_tuple


class Consumed(Protocol):
    queue: str


@dataclass
class WireWindow:
    """What one broker channel was told: its channel-wide limit (0: none), the per-consumer
    limit its consumers were started with (0: none) and, per kombu consumer tag, the tag the
    consumer runs under on this broker (and the kombu tags it ever ran under, so that a tag
    once cancelled is never consumed under again)."""

    channel_limit: int = 0
    consumer_limit: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)


class PrefetchWindow:
    """The prefetch of one :class:`~kombu_beetle.channel.BeetleChannel`, on each broker's
    channel.

    ``queue_is_classic(queue)`` says whether this connection can vouch that ``queue`` is a
    classic queue on every broker; ``consume(sub, tag, broker_tag)`` starts the consumer
    of kombu tag ``tag`` on broker channel ``sub`` under ``broker_tag``."""

    def __init__(
        self,
        queue_is_classic: Callable[[str], bool],
        consume: Callable[[Any, str, str], None],
    ) -> None:
        self.size = 0
        #: the count Celery asked for; None until it asks (RabbitMQ's default: no limit)
        self.count: int | None = None
        self._queue_is_classic = queue_is_classic
        self._consume = consume
        self._serial = itertools.count(1)

    def set(self, size: int, count: int) -> None:
        self.size, self.count = size, count

    @staticmethod
    def wire(sub: Any) -> WireWindow:
        window: WireWindow | None = getattr(sub, "beetle_window", None)
        if window is None:
            window = sub.beetle_window = WireWindow()
        return window

    def broker_tag(self, sub: Any, tag: str) -> str | None:
        return self.wire(sub).tags.get(tag)

    def forget(self, sub: Any, tag: str) -> None:
        self.wire(sub).tags.pop(tag, None)

    def apply(self, sub: Any, consumers: Mapping[str, Consumed]) -> None:
        """Bring ``sub`` to the count asked for, given the ``consumers`` it runs (or is about
        to run): set the limits, and consume again what runs under an outdated limit."""
        if self.count is None:
            return
        wire = self.wire(sub)
        channel_wide = _channel_wide_allowed(sub) and all(
            self._queue_is_classic(c.queue) for c in consumers.values()
        )
        want_channel, want_consumer = (self.count, 0) if channel_wide else (0, self.count)
        if wire.channel_limit and not want_channel:
            # lifted before anything is consumed per consumer: a quorum queue refuses a
            # consumer on a channel with a channel-wide limit
            sub.basic_qos(0, 0, True)
            wire.channel_limit = 0
        if wire.consumer_limit != want_consumer:
            sub.basic_qos(self.size, want_consumer, False)
            wire.consumer_limit = want_consumer
            for tag, old in list(wire.tags.items()):
                if tag not in consumers:
                    del wire.tags[tag]
                elif old in sub.callbacks:  # one its broker cancelled is consumed again later
                    sub.basic_cancel(old)
                    self._start(sub, tag)
        if want_channel and wire.channel_limit != want_channel:
            sub.basic_qos(self.size, want_channel, True)
            wire.channel_limit = want_channel

    def consume(self, sub: Any, tag: str, consumers: Mapping[str, Consumed]) -> None:
        """Start the consumer ``tag`` (one of ``consumers``) on ``sub`` under the window."""
        self.apply(sub, consumers)
        self._start(sub, tag)

    def _start(self, sub: Any, tag: str) -> None:
        wire = self.wire(sub)
        broker_tag = tag if tag not in wire.used else f"{tag}.{next(self._serial)}"
        wire.used.add(tag)
        wire.tags[tag] = broker_tag
        self._consume(sub, tag, broker_tag)


def _channel_wide_allowed(sub: Any) -> bool:
    """RabbitMQ 3.3 to 3.x: a channel-wide prefetch that reaches running consumers (4.0
    deprecates it; before 3.3 ``global=False`` meant the channel)."""
    connection = getattr(sub, "connection", None)
    properties = getattr(connection, "server_properties", None) or {}
    if properties.get("product") != "RabbitMQ" or not properties.get("version"):
        return False
    return (3, 3) <= version_string_as_tuple(str(properties["version"]))[:2] < (4, 0)
