"""The transport-level channel: one py-amqp channel per live broker behind it.

Declarations, ``basic_qos``, ``basic_consume`` and cancels fan out to every
broker (and are replayed on a broker that comes back; the prefetch window is applied as
:mod:`kombu_beetle.prefetch` says, so that Celery can widen it while consumers run); a
:class:`~kombu_beetle.publish.Publisher` publishes on this channel's per-broker
channels; deliveries stay bound to the channel of the broker that delivered
them, so acks and rejects go back there.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import amqp
from kombu.transport import base
from kombu.transport.base import to_rabbitmq_queue_arguments

from .brokers import CAUGHT_ERRORS, BrokerChannel, BrokerLink, Delivery, fail_or_raise
from .channel_host import BROKER_HEADER, ChannelHost, tag_deliveries
from .errors import NoBrokerAvailable
from .prefetch import PrefetchWindow

if TYPE_CHECKING:
    from .publish import Publisher

logger = logging.getLogger(__name__)

CHANNEL_ERRORS = amqp.Connection.channel_errors
#: a consumer its broker cancelled (its queue was deleted: ``beetle queues migrate``
#: re-creates it at once) is consumed again once the queue exists, looked for this often
RECONSUME_INTERVAL_S = 0.3
#: a queue still missing after this long is declared again, as a reconnect would
REDECLARE_AFTER_S = 5.0


@dataclass
class ConsumerSpec:
    queue: str
    no_ack: bool
    callback: Any
    arguments: Any
    on_cancel: Any
    exclusive: bool = False


class BeetleChannel(base.StdChannel):
    """Looks like a kombu pyamqp channel; fans out to one channel per broker."""

    Message = Delivery

    def __init__(self, connection: ChannelHost, channel_id: int) -> None:
        self.connection = connection
        self.channel_id = channel_id
        self.events: defaultdict[str, set[Any]] = defaultdict(set)
        self.is_open = True
        self._subs: dict[BrokerLink, tuple[int, BrokerChannel]] = {}
        self._consumers: dict[str, ConsumerSpec] = {}
        #: (broker, consumer tag) -> when the broker cancelled it (and when last looked at)
        self._cancelled: dict[tuple[BrokerLink, str], tuple[float, float]] = {}
        self._window = PrefetchWindow(connection.declarations.declared_classic, self._consume_under)
        for link in connection.brokers.live():
            try:
                self._sub(link)
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)

    def __repr__(self) -> str:
        return f"<BeetleChannel {self.channel_id} brokers={[link.name for link in self._subs]}>"

    # -- per-broker channels --------------------------------------------------------

    def _sub(self, link: BrokerLink) -> BrokerChannel:
        """The open channel on ``link``, opened (and set up again) if needed."""
        entry = self._subs.get(link)
        if entry is not None:
            generation, sub = entry
            if generation == link.generation and sub.is_open and sub.connection is not None:
                return sub
        return self._open_sub(link)

    def _open_sub(self, link: BrokerLink) -> BrokerChannel:
        if link.conn is None:
            raise NoBrokerAvailable([link.name], "broker is down")
        sub = link.conn.channel()
        sub.beetle_link = link
        sub.beetle_acks = self.connection.ack_batcher
        if self.connection.options.confirm_publish:
            sub.confirm_select()
            sub._confirm_selected = True
        sub.events["basic_return"].add(self._on_return)
        self._subs[link] = (link.generation, sub)
        self._window.apply(sub, self._consumers)
        for tag in self._consumers:
            self._window.consume(sub, tag, self._consumers)
        return sub

    def _on_return(self, *args: Any) -> None:
        for callback in list(self.events["basic_return"]):
            callback(*args)

    def attach(self, link: BrokerLink) -> None:
        """A broker came back: set up this channel's state on it."""
        if self.is_open:
            self._sub(link)

    def detach(self, link: BrokerLink) -> None:
        """A broker went away: forget its channel (its deliveries are redelivered)."""
        self._subs.pop(link, None)

    def broker_channels(self) -> list[BrokerChannel]:
        """This channel's open channel on each broker."""
        return [sub for _, sub in self._subs.values()]

    def forget_all(self, graceful: bool) -> None:
        subs = [sub for _, sub in self._subs.values()]
        self._subs.clear()
        self.is_open = False
        if graceful:
            for sub in subs:
                _close_quietly(sub)

    def _live_subs(self) -> list[tuple[BrokerLink, BrokerChannel]]:
        self.connection.maintain()
        subs = []
        for link in self.connection.brokers.live():
            try:
                subs.append((link, self._sub(link)))
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)
        return subs

    def _fanout(
        self, method: str, *args: Any, all_must_succeed: bool = True, **kwargs: Any
    ) -> list[Any]:
        """Call ``method`` on every live broker; a dead one is skipped and revived later."""
        results = self._on_each_broker(
            lambda sub: getattr(sub, method)(*args, **kwargs), all_must_succeed
        )
        if not results:
            raise NoBrokerAvailable(self.connection.brokers.names(), f"{method} reached none")
        return results

    def _on_each_broker(
        self, call: Callable[[BrokerChannel], Any], all_must_succeed: bool = True
    ) -> list[Any]:
        """``call(sub)`` on every live broker's channel; a channel error reopens that
        channel and is raised after the others were called (when ``all_must_succeed``, or
        when no broker answered); a dead broker is skipped and revived later."""
        results: list[Any] = []
        errors: list[BaseException] = []
        for link, sub in self._live_subs():
            try:
                results.append(call(sub))
            except CHANNEL_ERRORS as exc:
                errors.append(exc)
                self._subs.pop(link, None)
                self._reopen_after_error(link)
                # the close may have been another channel's, read while this call waited
                self.connection.reopen_closed(link)
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)
        if errors and (all_must_succeed or not results):
            raise errors[0]
        return results

    def reopen_closed(self, link: BrokerLink) -> None:
        """The broker closed this channel's channel on ``link`` (a consumer timeout, say):
        py-amqp reopened it bare, so it is replaced by one with the prefetch window and
        every consumer. What the closed one held comes back from the broker."""
        entry = self._subs.get(link)
        if entry is None or not entry[1].beetle_revived:
            return
        del self._subs[link]
        self._reopen_after_error(link)

    def _reopen_after_error(self, link: BrokerLink) -> None:
        """A channel error closed this broker's channel: keep its consumers going."""
        if not self._consumers and self._window.count is None:
            return
        try:
            self._sub(link)
        except CHANNEL_ERRORS as exc:
            logger.error("beetle: cannot reopen channel on %s: %r", link.name, exc)
        except CAUGHT_ERRORS as exc:
            fail_or_raise(link, exc)

    # -- declarations ----------------------------------------------------------------

    def _declare(self, method: str, **kwargs: Any) -> list[Any]:
        results = self._on_declaring_channels(method, **kwargs)
        self.connection.declarations.record(method, kwargs)
        return results

    def _on_declaring_channels(
        self, method: str, all_must_succeed: bool = True, **kwargs: Any
    ) -> list[Any]:
        """``method`` on each live broker's declaration channel (never on one that
        consumes: a refused declaration closes its channel and gives back what it held);
        a channel error is raised after the other brokers were called (when
        ``all_must_succeed``, or when no broker answered)."""
        self.connection.maintain()
        results: list[Any] = []
        errors: list[BaseException] = []
        for link in self.connection.brokers.live():
            try:
                results.append(getattr(link.declaring_channel(), method)(**kwargs))
            except CHANNEL_ERRORS as exc:
                errors.append(exc)
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)
        if errors and (all_must_succeed or not results):
            raise errors[0]
        if not results:
            raise NoBrokerAvailable(self.connection.brokers.names(), f"{method} reached none")
        return results

    def exchange_declare(self, exchange: str = "", type: str = "direct", **kwargs: Any) -> None:
        if kwargs.get("passive"):
            self._on_declaring_channels(
                "exchange_declare", exchange=exchange, type=type, all_must_succeed=False, **kwargs
            )
            return
        self._declare("exchange_declare", exchange=exchange, type=type, **kwargs)

    def exchange_delete(self, exchange: str = "", **kwargs: Any) -> None:
        self._fanout("exchange_delete", exchange=exchange, **kwargs)
        self.connection.declarations.forget("exchange_delete", {"exchange": exchange})

    def exchange_bind(
        self, destination: str = "", source: str = "", routing_key: str = "", **kwargs: Any
    ) -> None:
        self._declare(
            "exchange_bind",
            destination=destination,
            source=source,
            routing_key=routing_key,
            **kwargs,
        )

    def exchange_unbind(
        self, destination: str = "", source: str = "", routing_key: str = "", **kwargs: Any
    ) -> None:
        args = dict(destination=destination, source=source, routing_key=routing_key, **kwargs)
        self._fanout("exchange_unbind", **args)
        self.connection.declarations.forget("exchange_unbind", args)

    def queue_declare(self, queue: str = "", passive: bool = False, **kwargs: Any) -> Any:
        if not queue:
            # a server-named queue would get a different name on every broker
            queue = f"beetle.gen-{uuid.uuid4().hex}"
        if passive:
            results = self._on_declaring_channels(
                "queue_declare", queue=queue, passive=True, all_must_succeed=False, **kwargs
            )
        else:
            try:
                results = self._declare("queue_declare", queue=queue, **kwargs)
            except amqp.PreconditionFailed as exc:
                if not inequivalent_arguments(exc):
                    raise
                results = self._use_existing_queue(queue, kwargs, exc)
        found = [r for r in results if r is not None]
        if not found:
            return None  # nowait
        return amqp.protocol.queue_declare_ok_t(
            queue, sum(r.message_count for r in found), sum(r.consumer_count for r in found)
        )

    def _use_existing_queue(self, queue: str, kwargs: dict[str, Any], exc: BaseException) -> Any:
        """A broker holds ``queue`` with other arguments than ours: use it as it is.

        That is a live migration (``beetle queues migrate``) half done, or done while this
        worker's config still names the old arguments: in a blue-green deploy, old and new
        workers declare one queue with different arguments, and each must go on consuming
        it on every broker rather than stop on the first that was migrated."""
        logger.warning(
            "beetle: queue %r exists on a broker with other arguments than %r (%s); "
            "consuming it as it is (a queue migration, or a config to update)",
            queue,
            kwargs.get("arguments"),
            getattr(exc, "reply_text", exc),
        )
        self.connection.declarations.record("queue_declare", {"queue": queue, **kwargs})
        self.connection.declarations.type_unknown(queue)
        return self._on_declaring_channels(
            "queue_declare", queue=queue, passive=True, all_must_succeed=False
        )

    def queue_bind(
        self, queue: str = "", exchange: str = "", routing_key: str = "", **kwargs: Any
    ) -> None:
        self._declare(
            "queue_bind", queue=queue, exchange=exchange, routing_key=routing_key, **kwargs
        )

    def queue_unbind(
        self, queue: str = "", exchange: str = "", routing_key: str = "", **kwargs: Any
    ) -> None:
        args = dict(queue=queue, exchange=exchange, routing_key=routing_key, **kwargs)
        self._fanout("queue_unbind", **args)
        self.connection.declarations.forget("queue_unbind", args)

    def queue_purge(self, queue: str = "", **kwargs: Any) -> int:
        return sum(r or 0 for r in self._fanout("queue_purge", queue=queue, **kwargs))

    def queue_delete(self, queue: str = "", **kwargs: Any) -> int:
        counts = self._fanout("queue_delete", queue=queue, **kwargs)
        self.connection.declarations.forget("queue_delete", {"queue": queue})
        return sum(c or 0 for c in counts)

    # -- consuming ------------------------------------------------------------------

    def basic_qos(
        self, prefetch_size: int = 0, prefetch_count: int = 0, a_global: bool = False, **kwargs: Any
    ) -> None:
        """Celery's window: its count, applied per broker channel as
        :mod:`kombu_beetle.prefetch` says (``a_global`` is not followed)."""
        self._window.set(prefetch_size, prefetch_count)
        # a broker whose channel fails here gets a new one, set up with this window: the
        # error is not Celery's to handle (a channel error in basic.qos stops its worker)
        try:
            self._on_each_broker(
                lambda sub: self._window.apply(sub, self._consumers), all_must_succeed=False
            )
        except CHANNEL_ERRORS as exc:  # every broker closed its channel: each is reopened
            logger.warning("beetle: basic.qos met closed channels (%r); reopened", exc)

    def basic_consume(
        self,
        queue: str = "",
        consumer_tag: str = "",
        no_local: bool = False,
        no_ack: bool = False,
        exclusive: bool = False,
        nowait: bool = False,
        callback: Any = None,
        arguments: Any = None,
        on_cancel: Any = None,
        **kwargs: Any,
    ) -> str:
        tag = consumer_tag or f"beetle-{uuid.uuid4().hex}"
        spec = ConsumerSpec(
            queue, no_ack, tag_deliveries(callback, tag, self.connection), arguments, on_cancel,
            exclusive,
        )  # fmt: skip
        subs = self._live_subs()
        if not subs:
            raise NoBrokerAvailable(self.connection.brokers.names(), "cannot consume")
        self._consumers[tag] = spec
        errors: list[BaseException] = []
        for link, sub in subs:
            try:
                self._window.consume(sub, tag, self._consumers)
            except CHANNEL_ERRORS as exc:
                errors.append(exc)
                self._subs.pop(link, None)
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)
        if errors and len(errors) == len(subs):
            self._consumers.pop(tag, None)
            raise errors[0]
        return tag

    def _consume_under(self, sub: BrokerChannel, tag: str, broker_tag: str) -> None:
        """Start consumer ``tag`` on ``sub`` under ``broker_tag`` (the prefetch window's call:
        it consumes again under a fresh tag when the window changes)."""
        spec = self._consumers[tag]
        sub.basic_consume(
            queue=spec.queue,
            consumer_tag=broker_tag,
            no_ack=spec.no_ack,
            exclusive=spec.exclusive,
            callback=spec.callback,
            arguments=spec.arguments,
            on_cancel=self._on_server_cancel(sub, tag, spec),
        )

    def _on_server_cancel(self, sub: BrokerChannel, tag: str, spec: ConsumerSpec) -> Any:
        """What py-amqp calls when the broker cancels a consumer (its queue was deleted).

        Without it py-amqp raises ``ConsumerCancelled`` and the whole broker link would be
        dropped and reconnected, every delivery of every queue on it redone. Instead the
        consumer alone is consumed again once its queue exists (:meth:`reconsume_due`), as a
        queue of unknown type (a migration may have made it a quorum queue)."""
        link = sub.beetle_link

        def on_cancel(consumer_tag: str) -> None:
            logger.warning(
                "beetle: %s cancelled the consumer of queue %r (deleted or migrated); "
                "consuming it again once it exists",
                link.name if link is not None else "a broker",
                spec.queue,
            )
            self._window.forget(sub, tag)
            self.connection.declarations.type_unknown(spec.queue)
            if link is not None:
                now = time.monotonic()
                self._cancelled[(link, tag)] = (now, now)
            if spec.on_cancel is not None:
                spec.on_cancel(tag)

        return on_cancel

    def reconsume_due(self) -> None:
        """Consume again what a broker cancelled, once its queue is back (the connection's
        maintenance timer calls this; cheap when nothing was cancelled)."""
        if not self._cancelled:
            return
        now = time.monotonic()
        for key, (since, looked) in list(self._cancelled.items()):
            link, tag = key
            spec = self._consumers.get(tag)
            if spec is None or not self.is_open:
                del self._cancelled[key]
                continue
            if now - looked < RECONSUME_INTERVAL_S or not link.alive:
                continue
            self._cancelled[key] = (since, now)
            try:
                sub = self._sub(link)
                if self._window.broker_tag(sub, tag) in sub.callbacks:  # a reconnect did it
                    del self._cancelled[key]
                    continue
                if not _queue_exists(link, spec.queue):
                    if now - since < REDECLARE_AFTER_S:
                        continue
                    self.connection.declarations.replay(link, queue=spec.queue)
                self._window.consume(sub, tag, self._consumers)
                del self._cancelled[key]
            except CHANNEL_ERRORS as exc:
                logger.warning("beetle: cannot consume %r again on %s: %r", spec.queue, link, exc)
                self._subs.pop(link, None)
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)

    def basic_cancel(self, consumer_tag: str, **kwargs: Any) -> None:
        self._consumers.pop(consumer_tag, None)
        for link, sub in list(self._live_subs()):
            broker_tag = self._window.broker_tag(sub, consumer_tag)
            self._window.forget(sub, consumer_tag)
            if broker_tag is None or broker_tag not in sub.callbacks:
                continue
            try:
                sub.basic_cancel(broker_tag)
            except CHANNEL_ERRORS:
                self._subs.pop(link, None)
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)

    def basic_get(self, queue: str = "", no_ack: bool = False, **kwargs: Any) -> Any:
        """The next message of ``queue`` from whichever broker has one."""
        subs = self._live_subs()
        if not subs:
            raise NoBrokerAvailable(self.connection.brokers.names(), "cannot get")
        start = self.connection.brokers.rotate(len(subs))
        errors: list[BaseException] = []
        for link, sub in subs[start:] + subs[:start]:
            try:
                message = sub.basic_get(queue=queue, no_ack=no_ack)
            except CHANNEL_ERRORS as exc:
                errors.append(exc)
                self._subs.pop(link, None)
                continue
            except CAUGHT_ERRORS as exc:
                fail_or_raise(link, exc)
                continue
            if message is not None:
                return message
        if errors and len(errors) == len(subs):
            raise errors[0]
        return None

    def basic_recover(self, requeue: bool = True) -> None:
        self._fanout("basic_recover", requeue=requeue)

    def flow(self, active: bool) -> None:
        self._fanout("flow", active)

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        raise NotImplementedError(
            "ack through the message (message.ack()): a delivery tag alone does not say "
            "which broker delivered it"
        )

    basic_reject = basic_ack

    # -- messages -------------------------------------------------------------------

    def prepare_message(
        self,
        body: Any,
        priority: Any = None,
        content_type: Any = None,
        content_encoding: Any = None,
        headers: Any = None,
        properties: Any = None,
    ) -> amqp.Message:
        return amqp.Message(
            body,
            priority=priority,
            content_type=content_type,
            content_encoding=content_encoding,
            application_headers=headers,
            **properties or {},
        )

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> Any:
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def message_to_python(self, raw_message: Any) -> Delivery:
        channel = raw_message.channel
        if BROKER_HEADER not in raw_message.delivery_info:
            link = getattr(channel, "beetle_link", None)
            if link is not None:
                raw_message.delivery_info[BROKER_HEADER] = link.name
        return self.Message(raw_message, channel=channel)

    def basic_publish(
        self,
        message: amqp.Message,
        exchange: str = "",
        routing_key: str = "",
        mandatory: bool = False,
        immediate: bool = False,
        **kwargs: Any,
    ) -> None:
        self.publisher.publish(
            message,
            exchange,
            routing_key,
            mandatory,
            immediate,
            timeout=kwargs.get("confirm_timeout") or kwargs.get("timeout"),
        )

    @cached_property
    def publisher(self) -> Publisher:
        """Built at the first publish: a consumer's channel never needs one."""
        return self.connection.publisher_for(self._sub)

    def close(self) -> None:
        if not self.is_open:
            return
        self.forget_all(graceful=True)
        self._consumers.clear()
        self.connection.remove_channel(self)

    def after_reply_message_received(self, queue: str) -> None:
        pass


def _queue_exists(link: BrokerLink, queue: str) -> bool:
    """A passive declare on a channel of its own (a 404 closes the channel it came on)."""
    if link.conn is None:
        return False
    channel = link.conn.channel()
    try:
        channel.queue_declare(queue=queue, passive=True)
        return True
    except amqp.NotFound:
        return False
    finally:
        _close_quietly(channel)


def inequivalent_arguments(exc: BaseException) -> bool:
    """Was ``exc`` a declaration refused because the queue exists with other arguments?"""
    return isinstance(exc, amqp.PreconditionFailed) and "inequivalent arg" in str(
        getattr(exc, "reply_text", "") or exc
    )


def _close_quietly(sub: BrokerChannel) -> None:
    try:
        if sub.is_open and sub.connection is not None:
            sub.close()
    except Exception as exc:
        logger.debug("beetle: closing a channel failed: %r", exc)
