""":func:`kombu_beetle.properties.encode_properties` writes py-amqp's bytes, and raises
py-amqp's errors, for whatever a message's properties hold."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import Any

import amqp
import pytest

from kombu_beetle.properties import encode_properties

CELERY_HEADERS = {
    "lang": "py",
    "task": "proj.charge",
    "id": "01a217dc-e543-7149-9e00-5d93ebf464b0",
    "shadow": None,
    "eta": None,
    "expires": None,
    "group": None,
    "group_index": None,
    "retries": 0,
    "timelimit": [None, None],
    "root_id": "01a217dc-e543-7149-9e00-5d93ebf464b0",
    "parent_id": None,
    "argsrepr": "(0,)",
    "kwargsrepr": "{}",
    "origin": "gen15673@vm",
    "ignore_result": False,
    "stamps": {},
    "x-beetle-flags": 1,
    "x-beetle-expires-at": 1795783082,
    "x-beetle-published-at": 1795783082123,
}


def _same(message: amqp.Message) -> None:
    assert encode_properties(message) == message._serialize_properties()


def _value(rng: random.Random, depth: int = 0) -> Any:
    choices: list[Any] = [
        lambda: "".join(rng.choice("abcé€\U0001f41e") for _ in range(rng.randrange(6))),
        lambda: rng.choice([0, 1, -1, 2**31 - 1, -(2**31 - 1), 2**31, -(2**31), 2**63 - 1]),
        lambda: rng.randrange(-(2**40), 2**40),
        lambda: rng.random() * 1e6,
        lambda: rng.choice([True, False]),
        lambda: None,
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(5))),
    ]
    if depth < 3:
        choices += [
            lambda: {f"k{i}": _value(rng, depth + 1) for i in range(rng.randrange(4))},
            lambda: [_value(rng, depth + 1) for _ in range(rng.randrange(4))],
            lambda: tuple(_value(rng, depth + 1) for _ in range(rng.randrange(3))),
        ]
    return rng.choice(choices)()


def test_a_celery_task_message_is_written_byte_for_byte_as_py_amqp_writes_it():
    _same(
        amqp.Message(
            b"[]",
            application_headers=CELERY_HEADERS,
            message_id=CELERY_HEADERS["id"],
            correlation_id=CELERY_HEADERS["id"],
            reply_to="7f7c2804-fbed-327e-94b2-8a937c9bf22b",
            delivery_mode=2,
            content_type="application/json",
            content_encoding="utf-8",
        )
    )


def test_random_properties_and_headers_are_written_as_py_amqp_writes_them():
    rng = random.Random(28)
    for _ in range(2000):
        properties: dict[str, Any] = {
            "application_headers": {f"h{i}": _value(rng) for i in range(rng.randrange(8))},
        }
        for name, kind in amqp.Message.PROPERTIES:
            if name == "application_headers" or rng.random() < 0.5:
                continue
            if kind == "s":
                properties[name] = rng.choice(["", "x", "application/json", "é" * 100])
            elif kind == "o":
                properties[name] = rng.randrange(256)
            else:
                properties[name] = rng.randrange(2**64)
        _same(amqp.Message(b"", **properties))


@pytest.mark.parametrize(
    "properties",
    [
        {"application_headers": {"when": dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)}},
        {"application_headers": {"amount": Decimal("12.50")}},
        {"application_headers": {}},
        {"message_id": 0},  # py-amqp writes an empty string for a falsy shortstr
        {"message_id": b"raw"},
        {"delivery_mode": True},
        {"application_headers": {"nested": {"deeper": [1, (2.5, None), {"x": b"y"}]}}},
        {"application_headers": {b"bytes-key": 1}},
        {"application_headers": {"big": 2**63 - 1, "small": -(2**63)}},
        {"content_type": "é" * 127},
    ],
)
def test_unusual_values_are_written_as_py_amqp_writes_them(properties):
    _same(amqp.Message(b"", **properties))


@pytest.mark.parametrize(
    "properties",
    [
        {"priority": "high"},
        {"priority": 256},
        {"delivery_mode": 2.5},
        {"timestamp": -1},
        {"message_id": 7},
        {"content_type": "x" * 256},
        {"application_headers": {"huge": 2**64}},
        {"application_headers": {"odd": {1, 2}}},
        {"application_headers": {"k" * 256: 1}},
        {"application_headers": {7: "int key"}},
        {"application_headers": ["not", "a", "table"]},
    ],
)
def test_a_value_amqp_cannot_carry_raises_what_py_amqp_raises(properties):
    message = amqp.Message(b"", **properties)
    with pytest.raises(Exception) as theirs:
        message._serialize_properties()
    with pytest.raises(type(theirs.value)):
        encode_properties(message)
