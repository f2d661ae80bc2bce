"""Publishing: a redundant message to two brokers, everything else to one.

A body over ``max_message_bytes`` is refused before anything is written, with
:class:`~kombu_beetle.errors.MessageTooLarge`: written, it could outlast the
socket timeout and make a healthy broker look dead.

Both copies of a redundant message are written before either confirm is
awaited, so redundancy costs one confirm round trip, not two.  A broker that
fails (write error, confirm timeout) is marked dead and the copy goes to the
next live broker instead; only when no broker is left does the publish fail,
with :class:`~kombu_beetle.errors.NoBrokerAvailable` so Celery's publish retry
policy applies.

A confirm timeout is ambiguous (the stalled broker may still hold the message),
so the copy is sent elsewhere: at-least-once, as Celery's own publish retry
does.  For redundant messages the worker side deduplicates the extra copy.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import amqp
from amqp import spec
from amqp.exceptions import FrameSyntaxError, MessageNacked

from . import metrics
from .brokers import CAUGHT_ERRORS, BrokerChannel, BrokerLink, BrokerSet, fail_or_raise
from .envelope import (
    REPUBLISHED_HEADER,
    InvalidExpiry,
    ensure_message_id,
    is_redundant,
    stamp_redundant,
)
from .errors import MessageTooLarge, NoBrokerAvailable, PublishNotConfirmed, UnencodableMessage
from .frames import body_size, serialize_properties, write_publish
from .options import BeetleOptions
from .scopes import scope_of
from .trace import NullTracer, Tracer

logger = logging.getLogger(__name__)

_CONFIRMS = [spec.Basic.Ack, spec.Basic.Nack]
#: what py-amqp's serializer raises for a property or header value AMQP cannot carry
_ENCODING_ERRORS = (TypeError, ValueError, KeyError, OverflowError, struct.error, FrameSyntaxError)


def _trace(
    tracer: Any,
    properties: dict[str, Any],
    scope: str,
    wanted: int,
    done: list[BrokerLink],
    failed: list[str],
) -> None:
    """One ``published`` event per copy of a redundant message, confirmed or not; ``queue``
    is the dedup scope of the routing key (the ``dedup_scopes`` option).

    See kombu_beetle.trace for the event's fields.
    """
    headers = properties.get("application_headers") or {}
    common = {
        "task_name": headers.get("task"),
        "task_id": headers.get("id"),
    }
    copies = [(link.name, True) for link in done] + [(name, False) for name in failed]
    for broker, confirmed in copies:
        tracer.emit(
            "published",
            properties["message_id"],
            queue=scope,
            broker=broker,
            detail={"confirmed": confirmed, "redundant": True, "copies": wanted},
            **common,
        )


def _confirm_handler(method: Any, *args: Any) -> None:
    if method == spec.Basic.Nack:
        raise MessageNacked()


@dataclass(slots=True)
class Copies:
    """One message on its way: the brokers to try, where it got to, what failed.

    Kept apart from :class:`Publisher` so that several can be in flight at once (written,
    their confirms awaited later), and so the write and the confirm wait stay two steps.
    """

    message: amqp.Message
    candidates: list[BrokerLink]
    wanted: int
    redundant: bool
    position: int = 0
    done: list[BrokerLink] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    nacked: bool = False
    #: the frames of a redundant message, by channel number: built once, written to each
    encoded: dict[int, bytes] | None = None
    #: the serialized properties, when made ahead (``publish_many`` checks them that way)
    properties: bytes | None = None

    @property
    def missing(self) -> int:
        return self.wanted - len(self.done)

    @property
    def more_to_try(self) -> bool:
        return self.missing > 0 and self.position < len(self.candidates)


@dataclass(slots=True)
class Outgoing:
    """One message for :meth:`Publisher.publish_many`."""

    message: amqp.Message
    exchange: str
    routing_key: str


@dataclass(slots=True)
class Outcome:
    """What became of one :class:`Outgoing`: the brokers that confirmed it, or the error
    that left it unpublished (``error`` set, ``brokers`` empty). ``degraded``: fewer
    copies than a redundant message wants (one broker was all there was, or a copy failed)."""

    brokers: list[str]
    error: BaseException | None = None
    degraded: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class Publisher:
    """Publishes for one channel of a :class:`~kombu_beetle.connection.BeetleConnection`.

    Built by the connection, which owns the options, the broker set and the tracer; the
    channel lends ``sub_for``, its own py-amqp channel on a broker (confirm mode is per
    channel, so the copies must go out on the caller's channels).
    """

    def __init__(
        self,
        options: BeetleOptions,
        brokers: BrokerSet,
        tracer: Tracer,
        sub_for: Callable[[BrokerLink], BrokerChannel],
        maintain: Callable[[], None],
    ) -> None:
        self.options = options
        self.brokers = brokers
        self.tracer = tracer
        self.sub_for = sub_for
        self.maintain = maintain

    def publish(
        self,
        message: amqp.Message,
        exchange: str,
        routing_key: str,
        mandatory: bool = False,
        immediate: bool = False,
        timeout: float | None = None,
    ) -> list[str]:
        """Publish ``message``; return the names of the brokers that took it."""
        self.refuse_oversized(message, exchange, routing_key)
        copies = self.choose(message, routing_key)
        while copies.more_to_try:
            batch = self.write(copies, exchange, routing_key, mandatory, immediate)
            self.await_confirms(copies, batch, timeout)
        return self.settle(copies, routing_key)

    def refuse_oversized(self, message: amqp.Message, exchange: str, routing_key: str) -> None:
        """Raise MessageTooLarge for a body over ``max_message_bytes``; no broker is touched."""
        limit = self.options.max_message_bytes
        size = body_size(message, limit)
        if size > limit:
            message_id = message.properties.get("message_id")
            raise MessageTooLarge(size, limit, message_id, exchange, routing_key)

    def choose(self, message: amqp.Message, routing_key: str) -> Copies:
        """How many copies, to which brokers in which order; stamps the beetle headers."""
        self.maintain()
        candidates = self.brokers.candidates()
        if not candidates:
            raise NoBrokerAvailable(self.brokers.names(), "every broker is down")
        options = self.options
        properties = message.properties
        redundant = is_redundant(
            properties.get("application_headers"), routing_key, options.redundant_queues
        )
        ensure_message_id(properties)
        wanted = options.redundancy if redundant else 1
        if redundant:
            stamp_redundant(properties, options.message_ttl_s, degraded=len(candidates) < wanted)
        return Copies(message, candidates, wanted, redundant, encoded={} if wanted > 1 else None)

    def write(
        self, copies: Copies, exchange: str, routing_key: str, mandatory: bool, immediate: bool
    ) -> list[tuple[BrokerLink, BrokerChannel]]:
        """Write the missing copies to the next live brokers; return those written to."""
        batch: list[tuple[BrokerLink, BrokerChannel]] = []
        candidates, message, encoded = copies.candidates, copies.message, copies.encoded
        properties = copies.properties
        missing = copies.missing
        while len(batch) < missing and copies.position < len(candidates):
            link = candidates[copies.position]
            copies.position += 1
            if not link.alive:
                continue
            try:
                sub = self.sub_for(link)
                write_publish(
                    sub, message, exchange, routing_key, mandatory, immediate, encoded, properties
                )
            except CAUGHT_ERRORS as exc:
                copies.failed.append(link.name)
                fail_or_raise(link, exc)
                continue
            batch.append((link, sub))
        return batch

    def await_confirms(
        self,
        copies: Copies,
        batch: list[tuple[BrokerLink, BrokerChannel]],
        timeout: float | None = None,
    ) -> None:
        """Wait for the confirms of ``batch`` under one deadline; record who took the copy."""
        options = self.options
        if not options.confirm_publish:
            copies.done.extend(link for link, _ in batch)
            return
        # the socket's own timeout (confirm_timeout, set at connect) bounds each read;
        # passing it again would cost two settimeout calls per frame
        custom = timeout is not None and timeout != options.confirm_timeout_s
        deadline = time.monotonic() + (timeout or options.confirm_timeout_s)
        for link, sub in batch:
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("confirm timeout")
                sub.wait(
                    _CONFIRMS, callback=_confirm_handler, timeout=remaining if custom else None
                )
            except MessageNacked:
                copies.nacked = True
                copies.failed.append(link.name)
                message_id = copies.message.properties["message_id"]
                logger.warning("beetle: %s nacked message %s", link.name, message_id)
                continue
            except CAUGHT_ERRORS as exc:
                copies.failed.append(link.name)
                fail_or_raise(link, exc)
                continue
            copies.done.append(link)

    def settle(self, copies: Copies, routing_key: str) -> list[str]:
        """Fail if no broker took the message, trace it, warn when a copy is missing."""
        properties = copies.message.properties
        done, failed = copies.done, copies.failed
        metrics.published(done, failed, copies.nacked, copies.redundant, copies.wanted)
        if not done:
            if copies.nacked:
                raise PublishNotConfirmed(
                    f"message {properties['message_id']} was nacked by {', '.join(failed)}"
                )
            raise NoBrokerAvailable(failed or self.brokers.names(), "publish failed on each")
        # Only redundant messages are audited: they are the ones workers deduplicate and trace
        # to the end (a plain task, a Celery event or a reply never writes "completed").
        republished = (properties.get("application_headers") or {}).get(REPUBLISHED_HEADER)
        if copies.redundant and not republished and not isinstance(self.tracer, NullTracer):
            scope = scope_of(self.options.dedup_scopes, routing_key)
            _trace(self.tracer, properties, scope, copies.wanted, done, failed)
        if copies.redundant and len(done) < copies.wanted <= len(copies.candidates):
            logger.warning(
                "beetle: redundant message %s stored on %d of %d brokers (%s)",
                properties["message_id"],
                len(done),
                copies.wanted,
                ", ".join(link.name for link in done),
            )
        return [link.name for link in done]

    # -- many in flight ------------------------------------------------------------------

    def publish_many(
        self, items: Sequence[Outgoing], timeout: float | None = None
    ) -> list[Outcome]:
        """Publish ``items`` with every copy written before any confirm is awaited (each
        written as soon as it is built, so the brokers start on the first while the last is
        being built).

        :meth:`publish` waits for one message's confirms before the next is written; here a
        batch costs about one confirm round trip in all, which is what a relay draining a
        table needs. Each message is settled as :meth:`publish` settles one (copies moved to
        the next broker when one fails, ``published`` traced), and its :class:`Outcome` says
        which brokers confirmed it; an error (too large, a bad expiry, no broker took it)
        is returned in its outcome, never raised, so one bad message does not fail the rest.
        A message whose properties or headers AMQP cannot carry fails with
        :class:`~kombu_beetle.errors.UnencodableMessage`: its properties are serialized once,
        before anything is written, and those bytes are what every copy carries.

        Confirms are matched to messages by delivery tag, so this must be the only way the
        channel publishes (a relay opens a channel of its own): :meth:`publish` on the same
        channel would shift the tags.
        """
        outcomes: list[Outcome | None] = [None] * len(items)
        flights: list[tuple[int, Copies, Outgoing]] = []
        sent: dict[BrokerChannel, dict[int, tuple[BrokerLink, Copies]]] = {}
        for index, item in enumerate(items):
            try:
                self.refuse_oversized(item.message, item.exchange, item.routing_key)
                copies = self.choose(item.message, item.routing_key)
            except (MessageTooLarge, InvalidExpiry, NoBrokerAvailable) as exc:
                outcomes[index] = Outcome([], exc)
                continue
            try:
                copies.properties = serialize_properties(item.message)
            except _ENCODING_ERRORS as exc:
                message_id = item.message.properties.get("message_id")
                outcomes[index] = Outcome([], UnencodableMessage(message_id, exc))
                continue
            if copies.encoded is None:  # one copy: written from the same bytes all the same
                copies.encoded = {}
            flights.append((index, copies, item))
            # written as soon as it is ready: the brokers start on the batch while the rest
            # of it is being built
            self._write_tagged(copies, item, sent)
        pending = flights
        while pending:
            self._await_tags(sent, timeout)
            pending = [flight for flight in pending if flight[1].more_to_try]
            sent = {}
            for _, copies, item in pending:  # the copies a failed broker did not take
                self._write_tagged(copies, item, sent)
        for index, copies, item in flights:
            try:
                brokers = self.settle(copies, item.routing_key)
            except (NoBrokerAvailable, PublishNotConfirmed) as exc:
                outcomes[index] = Outcome([], exc)
                continue
            outcomes[index] = Outcome(brokers, None, copies.redundant and copies.missing > 0)
        return [outcome for outcome in outcomes if outcome is not None]

    def _write_tagged(
        self,
        copies: Copies,
        item: Outgoing,
        sent: dict[BrokerChannel, dict[int, tuple[BrokerLink, Copies]]],
    ) -> None:
        """Write the missing copies of ``item``, noting each under its delivery tag."""
        for link, sub in self.write(copies, item.exchange, item.routing_key, False, False):
            tag = sub.beetle_sent = sub.beetle_sent + 1
            sent.setdefault(sub, {})[tag] = (link, copies)

    def _await_tags(
        self,
        sent: dict[BrokerChannel, dict[int, tuple[BrokerLink, Copies]]],
        timeout: float | None,
    ) -> None:
        """Wait, under one deadline, for the confirms of every tag in ``sent``; a broker
        that fails or times out loses all its unconfirmed copies (they go elsewhere)."""
        if not self.options.confirm_publish:
            for tags in sent.values():
                for link, copies in tags.values():
                    copies.done.append(link)
            return
        deadline = time.monotonic() + (timeout or self.options.confirm_timeout_s)
        for sub, tags in sent.items():
            link = next(iter(tags.values()))[0]
            try:
                _Confirms(link, tags).wait(sub, deadline)
            except CAUGHT_ERRORS as exc:
                for _, copies in tags.values():
                    copies.failed.append(link.name)
                tags.clear()
                fail_or_raise(link, exc)


class _Confirms:
    """The confirms one broker owes for the copies written to it, by delivery tag: an ack
    or nack may settle several at once (``multiple``).

    ``tags`` holds the tags in the order they were written, which is ascending: a multiple
    confirm settles a run from the front, found without looking at the tags after it.
    """

    def __init__(self, link: BrokerLink, tags: dict[int, tuple[BrokerLink, Copies]]) -> None:
        self.link, self.tags = link, tags

    def wait(self, sub: BrokerChannel, deadline: float) -> None:
        while self.tags:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("confirm timeout")
            sub.wait(_CONFIRMS, callback=self.on_confirm, timeout=remaining)

    def on_confirm(self, method: Any, tag: int, multiple: bool, *rest: Any) -> None:
        tags, link = self.tags, self.link
        if multiple:
            settled = []
            for t in tags:
                if t > tag:
                    break
                settled.append(t)
        else:
            settled = [tag]
        for t in settled:
            entry = tags.pop(t, None)
            if entry is None:
                continue
            copies = entry[1]
            if method == spec.Basic.Ack:
                copies.done.append(link)
                continue
            copies.nacked = True
            copies.failed.append(link.name)
            message_id = copies.message.properties["message_id"]
            logger.warning("beetle: %s nacked message %s", link.name, message_id)
