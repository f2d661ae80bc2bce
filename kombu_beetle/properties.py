"""A message's properties as its content header carries them: py-amqp's bytes, made faster.

py-amqp serializes the properties (the application headers among them, a Celery task has
two dozen) through a generic argument writer and a ``BytesIO`` per table: for a relay
draining a table that is the largest single cost per message. :func:`encode_properties`
writes the same bytes for the values a message usually holds (text, bytes, booleans, 64-bit
integers, floats, ``None``, and tables and arrays of them) by dispatching on the exact type;
for anything else (a ``Decimal``, a ``datetime``, a subclass, a string too long for its
field, an integer over 64 bits, a value AMQP cannot carry) it leaves the whole message to
py-amqp, so the bytes and the errors are py-amqp's own.
"""

from __future__ import annotations

from struct import Struct
from typing import Any

import amqp

__all__ = ["encode_properties"]

_SHORT = Struct(">H").pack
_BYTE = Struct("B").pack
_LONG = Struct(">I").pack
_LONGLONG = Struct(">Q").pack
_ITEM_INT = Struct(">ci").pack
_ITEM_LONG = Struct(">cq").pack
_ITEM_DOUBLE = Struct(">cd").pack
_I32 = 2147483647
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64_MAX = 2**64 - 1

_BASIC = amqp.Message.PROPERTIES
#: the basic class's properties in their order: name, flag bit, kind
_PROPERTIES = [(name, 1 << (15 - position), kind) for position, (name, kind) in enumerate(_BASIC)]


#: table keys as written (length and UTF-8): a publisher's headers have the same few dozen
_KEYS: dict[str, bytes] = {}
_KEYS_KEPT = 4096


class _Unusual(Exception):
    """A value the fast path does not write: py-amqp serializes the message instead."""


def encode_properties(message: amqp.Message) -> bytes:
    """``message._serialize_properties()``, the same bytes (or the same error), faster."""
    try:
        if message.PROPERTIES is not _BASIC:
            raise _Unusual
        return _encode(message.properties)
    except _Unusual:
        result: bytes = message._serialize_properties()
        return result


def _encode(props: dict[str, Any]) -> bytes:
    flags = 0
    parts: list[bytes] = [b""]
    append = parts.append
    for name, bit, kind in _PROPERTIES:
        value = props.get(name)
        if value is None:
            continue
        flags |= bit
        if kind == "s":
            append(_shortstr(value))
        elif kind == "F":
            if type(value) is not dict:
                raise _Unusual
            append(_table(value))
        elif kind == "o":
            if type(value) is not int or not 0 <= value <= 255:
                raise _Unusual
            append(_BYTE(value))
        elif kind == "L":
            if type(value) is not int or not 0 <= value <= _U64_MAX:
                raise _Unusual
            append(_LONGLONG(value))
        else:  # pragma: no cover - the basic class has no other kind
            raise _Unusual
    parts[0] = _SHORT(flags)
    return b"".join(parts)


def _shortstr(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        data = value.encode("utf-8", "surrogatepass")
    elif kind is bytes:
        data = value
    else:
        raise _Unusual
    if len(data) > 255:
        raise _Unusual
    return _BYTE(len(data)) + data


def _table(table: dict[Any, Any]) -> bytes:
    parts: list[bytes] = []
    append = parts.append
    keys = _KEYS
    for key, value in table.items():
        encoded = keys.get(key) if type(key) is str else None
        if encoded is None:
            encoded = _shortstr(key)
            if type(key) is str and len(keys) < _KEYS_KEPT:
                keys[key] = encoded
        append(encoded)
        # the commonest header values inline (a call per value is a third of the time)
        if value is None:
            append(b"V")
        elif type(value) is str:
            data = value.encode("utf-8", "surrogatepass")
            append(b"S" + _LONG(len(data)) + data)
        else:
            append(_item(value))
    data = b"".join(parts)
    return _LONG(len(data)) + data


def _array(values: list[Any] | tuple[Any, ...]) -> bytes:
    data = b"".join([_item(value) for value in values])
    return _LONG(len(data)) + data


def _item(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        data = value.encode("utf-8", "surrogatepass")
        return b"S" + _LONG(len(data)) + data
    if value is None:
        return b"V"
    if kind is int:
        if -_I32 <= value <= _I32:
            return _ITEM_INT(b"I", value)
        if _I64_MIN <= value <= _I64_MAX:
            return _ITEM_LONG(b"L", value)
        raise _Unusual
    if kind is bool:
        return b"t\x01" if value else b"t\x00"
    if kind is dict:
        return b"F" + _table(value)
    if kind is list or kind is tuple:
        return b"A" + _array(value)
    if kind is float:
        return _ITEM_DOUBLE(b"d", value)
    if kind is bytes:
        return b"S" + _LONG(len(value)) + value
    raise _Unusual
