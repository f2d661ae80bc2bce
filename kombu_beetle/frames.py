"""The bytes of a ``basic.publish``: built once for every copy, written without a poll.

py-amqp builds a message's frames anew for every ``basic_publish`` and reads the
socket before each one; for the two copies of a redundant message both are waste.
Here the frames are built once per channel number and the same bytes written to
each broker; a message that needs several body frames is left to py-amqp.
"""

from __future__ import annotations

from struct import pack

import amqp
from amqp import spec
from amqp.exceptions import RecoverableConnectionError
from amqp.method_framing import FRAME_OVERHEAD
from amqp.serialization import dumps

from .brokers import BrokerChannel
from .properties import encode_properties

_PUBLISH_SIG = pack(">HH", *spec.Basic.Publish)
#: the most bytes a character takes in UTF-8, UTF-16 or UTF-32 (one more for a BOM)
_MAX_BYTES_PER_CHAR = 4


def body_size(message: amqp.Message, at_most: int) -> int:
    """The body's length in bytes as it will be sent, exact whenever it is over ``at_most``.

    A ``str`` body is encoded by py-amqp at write time; encoding a large one here just to
    measure it would double the work, so it is measured only when its length in characters
    cannot settle the question (every encoding takes at least one byte per character).
    """
    body = message.body
    if not isinstance(body, str):
        return len(body)
    if (len(body) + 1) * _MAX_BYTES_PER_CHAR <= at_most:
        return len(body)
    return len(body.encode(message.properties.get("content_encoding") or "utf-8"))


def write_publish(
    sub: BrokerChannel,
    message: amqp.Message,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    immediate: bool,
    encoded: dict[int, bytes] | None = None,
    properties: bytes | None = None,
) -> None:
    """``basic.publish`` without py-amqp's pre-publish poll for ``connection.blocked``.

    py-amqp reads the socket before every publish to notice a blocked connection; here the
    confirm wait reads it right after, so the poll (a recv and two settimeout calls per copy)
    is skipped.  The socket's timeout bounds the write if the broker stops reading.  With
    ``encoded`` (a redundant message), the frames are built once per channel number and the
    same bytes go to every broker; ``properties``, when given, are the message's properties
    as :func:`serialize_properties` made them (so a caller that checked them by
    serializing them does not pay for it twice).
    """
    connection = sub.connection
    if connection is None:
        raise RecoverableConnectionError("basic_publish: connection closed")
    if encoded is not None:
        data = encoded.get(sub.channel_id)
        if data is None:
            frame_max = connection.frame_max
            args = (sub.channel_id, message, exchange, routing_key, mandatory, immediate, frame_max)
            data = encoded[sub.channel_id] = encode_publish(*args, properties=properties)
        if data:
            # one write of whole frames, as py-amqp's writer makes (a kombu connection is
            # used by one thread at a time, so no lock is needed around it)
            connection.transport.write(data)
            connection.bytes_sent += 1  # py-amqp's count of frames sent, for heartbeats
            return
    sub.send_method(
        spec.Basic.Publish, "Bssbb", (0, exchange, routing_key, mandatory, immediate), message
    )


def encode_publish(
    channel_id: int,
    message: amqp.Message,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    immediate: bool,
    frame_max: int,
    properties: bytes | None = None,
) -> bytes:
    """The frames of one ``basic.publish`` as bytes, so that both copies of a redundant
    message are serialized once (py-amqp would encode the properties again per broker).
    Empty when the message needs more than one body frame: then py-amqp writes it."""
    args = dumps("Bssbb", (0, exchange, routing_key, mandatory, immediate))
    if properties is None:
        properties = serialize_properties(message)
    body = message.body
    if isinstance(body, str):
        body = body.encode(message.properties["content_encoding"])
    if len(args) + len(properties) + len(body) + FRAME_OVERHEAD > frame_max - 8:
        return b""
    method = _PUBLISH_SIG + args
    header = pack(">HHQ", 60, 0, len(body)) + properties
    parts = [pack(">BHI", 1, channel_id, len(method)), method, b"\xce"]
    parts += [pack(">BHI", 2, channel_id, len(header)), header, b"\xce"]
    if body:
        parts += [pack(">BHI", 3, channel_id, len(body)), body, b"\xce"]
    return b"".join(parts)


def serialize_properties(message: amqp.Message) -> bytes:
    """The message's properties (headers included) as a content header carries them; a
    ``str`` body gets the ``content_encoding`` it will be encoded with, as py-amqp gives it.
    py-amqp's bytes, written faster (:mod:`.properties`). Raises what py-amqp's serializer
    raises for a value AMQP cannot carry (``struct.error``, ``TypeError``, ``ValueError``,
    ``OverflowError``, ``FrameSyntaxError``)."""
    if isinstance(message.body, str):
        message.properties.setdefault("content_encoding", "utf-8")
    return encode_properties(message)
