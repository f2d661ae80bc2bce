"""Publishing: a redundant message to two brokers, everything else to one.

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
import time
from struct import pack
from typing import TYPE_CHECKING, Any

import amqp
from amqp import spec
from amqp.exceptions import MessageNacked, RecoverableConnectionError
from amqp.method_framing import FRAME_OVERHEAD
from amqp.serialization import dumps

from .brokers import CAUGHT_ERRORS, BrokerChannel, BrokerLink, fail_or_raise
from .envelope import REPUBLISHED_HEADER, ensure_message_id, is_redundant, stamp_redundant
from .errors import NoBrokerAvailable, PublishNotConfirmed
from .trace import NullTracer

if TYPE_CHECKING:
    from .channel import BeetleChannel

logger = logging.getLogger(__name__)

_CONFIRMS = [spec.Basic.Ack, spec.Basic.Nack]
_PUBLISH_SIG = pack(">HH", *spec.Basic.Publish)


def _trace(
    tracer: Any,
    properties: dict[str, Any],
    routing_key: str,
    redundant: bool,
    wanted: int,
    done: list[BrokerLink],
    failed: list[str],
) -> None:
    """One ``published`` event per broker copy, confirmed or not (see kombu_beetle.trace)."""
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
            queue=routing_key,
            broker=broker,
            detail={"confirmed": confirmed, "redundant": redundant, "copies": wanted},
            **common,
        )


def _write(
    sub: BrokerChannel,
    message: amqp.Message,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    immediate: bool,
    encoded: dict[int, bytes] | None = None,
) -> None:
    """``basic.publish`` without py-amqp's pre-publish poll for ``connection.blocked``.

    py-amqp reads the socket before every publish to notice a blocked connection; here the
    confirm wait reads it right after, so the poll (a recv and two settimeout calls per copy)
    is skipped.  The socket's timeout bounds the write if the broker stops reading.  With
    ``encoded`` (a redundant message), the frames are built once per channel number and the
    same bytes go to every broker.
    """
    connection = sub.connection
    if connection is None:
        raise RecoverableConnectionError("basic_publish: connection closed")
    if encoded is not None:
        data = encoded.get(sub.channel_id)
        if data is None:
            frame_max = connection.frame_max
            args = (sub.channel_id, message, exchange, routing_key, mandatory, immediate, frame_max)
            data = encoded[sub.channel_id] = _encode(*args)
        if data:
            # one write of whole frames, as py-amqp's writer makes (a kombu connection is
            # used by one thread at a time, so no lock is needed around it)
            connection.transport.write(data)
            connection.bytes_sent += 1  # py-amqp's count of frames sent, for heartbeats
            return
    sub.send_method(
        spec.Basic.Publish, "Bssbb", (0, exchange, routing_key, mandatory, immediate), message
    )


def _encode(
    channel_id: int,
    message: amqp.Message,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    immediate: bool,
    frame_max: int,
) -> bytes:
    """The frames of one ``basic.publish`` as bytes, so that both copies of a redundant
    message are serialized once (py-amqp would encode the properties again per broker).
    Empty when the message needs more than one body frame: then py-amqp writes it."""
    args = dumps("Bssbb", (0, exchange, routing_key, mandatory, immediate))
    body = message.body
    if isinstance(body, str):
        body = body.encode(message.properties.setdefault("content_encoding", "utf-8"))
    properties = message._serialize_properties()
    if len(args) + len(properties) + len(body) + FRAME_OVERHEAD > frame_max - 8:
        return b""
    method = _PUBLISH_SIG + args
    header = pack(">HHQ", 60, 0, len(body)) + properties
    parts = [pack(">BHI", 1, channel_id, len(method)), method, b"\xce"]
    parts += [pack(">BHI", 2, channel_id, len(header)), header, b"\xce"]
    if body:
        parts += [pack(">BHI", 3, channel_id, len(body)), body, b"\xce"]
    return b"".join(parts)


def _confirm_handler(method: Any, *args: Any) -> None:
    if method == spec.Basic.Nack:
        raise MessageNacked()


def publish(
    channel: BeetleChannel,
    message: amqp.Message,
    exchange: str,
    routing_key: str,
    mandatory: bool = False,
    immediate: bool = False,
    timeout: float | None = None,
) -> list[str]:
    """Publish ``message``; return the names of the brokers that took it."""
    connection = channel.connection
    options = connection.options
    connection.maintain()
    candidates = connection.brokers.candidates()
    if not candidates:
        raise NoBrokerAvailable(connection.brokers.names(), "every broker is down")
    properties = message.properties
    redundant = is_redundant(
        properties.get("application_headers"), routing_key, options.redundant_queues
    )
    ensure_message_id(properties)
    wanted = options.redundancy if redundant else 1
    if redundant:
        stamp_redundant(properties, options.message_ttl_s, degraded=len(candidates) < wanted)
    confirm_timeout = timeout or options.confirm_timeout_s
    custom = timeout is not None and timeout != options.confirm_timeout_s
    done: list[BrokerLink] = []
    failed: list[str] = []
    nacked = False
    position = 0
    encoded: dict[int, bytes] | None = {} if wanted > 1 else None
    while len(done) < wanted and position < len(candidates):
        batch: list[tuple[BrokerLink, BrokerChannel]] = []
        while len(done) + len(batch) < wanted and position < len(candidates):
            link = candidates[position]
            position += 1
            if not link.alive:
                continue
            try:
                sub = channel.sub_for(link)
                _write(sub, message, exchange, routing_key, mandatory, immediate, encoded)
            except CAUGHT_ERRORS as exc:
                failed.append(link.name)
                fail_or_raise(link, exc)
                continue
            batch.append((link, sub))
        if not options.confirm_publish:
            done.extend(link for link, _ in batch)
            continue
        deadline = time.monotonic() + confirm_timeout
        for link, sub in batch:
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("confirm timeout")
                # the socket's own timeout (confirm_timeout, set at connect) bounds each
                # read; passing it again would cost two settimeout calls per frame
                sub.wait(
                    _CONFIRMS, callback=_confirm_handler, timeout=remaining if custom else None
                )
            except MessageNacked:
                nacked = True
                failed.append(link.name)
                logger.warning("beetle: %s nacked message %s", link.name, properties["message_id"])
                continue
            except CAUGHT_ERRORS as exc:
                failed.append(link.name)
                fail_or_raise(link, exc)
                continue
            done.append(link)
    if not done:
        if nacked:
            raise PublishNotConfirmed(
                f"message {properties['message_id']} was nacked by {', '.join(failed)}"
            )
        raise NoBrokerAvailable(failed or connection.brokers.names(), "publish failed on each")
    tracer = connection.tracer
    # Only redundant messages are audited: they are the ones workers deduplicate and trace
    # to the end (a plain task, a Celery event or a reply never writes "completed").
    republished = (properties.get("application_headers") or {}).get(REPUBLISHED_HEADER)
    if redundant and not republished and not isinstance(tracer, NullTracer):
        _trace(tracer, properties, routing_key, redundant, wanted, done, failed)
    if redundant and len(done) < wanted <= len(candidates):
        logger.warning(
            "beetle: redundant message %s stored on %d of %d brokers (%s)",
            properties["message_id"],
            len(done),
            wanted,
            ", ".join(link.name for link in done),
        )
    return [link.name for link in done]
