"""Poison: ``eo.record`` messages with a valid body but a bad client-controlled header.

Each :class:`Poison` names the header it spoils, so a test can check the dead letter says
which one. They are published raw (no transport, no stamping), the way a buggy or hostile
publisher would, to one broker's ``celery`` queue; with py-amqp, which (unlike pika)
encodes a float header. RabbitMQ itself refuses a header that is a double ``inf`` or NaN
(it closes the connection with 541 INTERNAL_ERROR), so those arrive only as text.

Used by tests/exactly_once/test_poison.py and the chaos scenario that mixes them into a
stream.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import amqp

from kombu_beetle.envelope import EXPIRES_AT_HEADER, FLAGS_HEADER, PUBLISHED_AT_HEADER

#: an hour from now: a valid expiry for poison whose bad header is another one
VALID_EXPIRY_S = 3600
#: the longest ``message_id`` AMQP can carry: a ``shortstr`` (a one-byte length)
AMQP_MAX_MESSAGE_ID = 255


@dataclass(frozen=True)
class Poison:
    """One bad message: ``header`` is the name the dead letter must mention."""

    label: str
    header: str
    headers: dict[str, Any] = field(default_factory=dict)
    #: True where running it once is as good as dead-lettering it (the spec allows either)
    may_run: bool = False


def _expires(value: Any) -> Poison:
    return Poison(f"expires-at {value!r}", EXPIRES_AT_HEADER, {EXPIRES_AT_HEADER: value})


POISON: tuple[Poison, ...] = (
    _expires("inf"),
    _expires("1e309"),  # a float() of it is inf, too
    _expires("nan"),
    _expires("abc"),
    _expires([1, 2]),
    Poison("published-at 'inf'", PUBLISHED_AT_HEADER, {PUBLISHED_AT_HEADER: "inf"}),
    Poison(
        "published-at 'inf', expires-at valid",
        PUBLISHED_AT_HEADER,
        {PUBLISHED_AT_HEADER: "inf", EXPIRES_AT_HEADER: None},  # None: a valid expiry
        may_run=True,
    ),
    Poison("flags 'zz'", FLAGS_HEADER, {FLAGS_HEADER: "zz"}),
)

#: the ones that must be dead-lettered (a chaos run's audit would call a run of the others
#: "unexpected": they were never published through the transport)
MUST_DEAD_LETTER = tuple(p for p in POISON if not p.may_run)


def task_body(*args: Any) -> bytes:
    """A Celery protocol 2 body: ``[args, kwargs, embed]``."""
    return json.dumps([list(args), {}, {"callbacks": None, "errbacks": None}]).encode()


def publish_raw(
    node: Any,
    vhost: str,
    *,
    body: bytes,
    message_id: str | None,
    task: str = "eo.record",
    queue: str = "celery",
    **headers: Any,
) -> str:
    """Publish one message to ``queue`` on ``node`` as a foreign publisher would; returns the
    Celery task id (the ``id`` header), by which its dead letter is found."""
    task_id = str(uuid.uuid4())
    properties: dict[str, Any] = {"message_id": message_id} if message_id is not None else {}
    message = amqp.Message(
        body,
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=2,
        application_headers={"lang": "py", "task": task, "id": task_id, **headers},
        **properties,
    )
    with amqp.Connection(
        node.host_port, userid=node.user, password=node.password, virtual_host=vhost
    ) as connection:
        connection.channel().basic_publish(message, exchange="", routing_key=queue)
    return task_id


def publish_poison(node: Any, vhost: str, poison: Poison, item: int) -> str:
    """Publish ``eo.record(item)`` spoiled by ``poison``; returns its task id."""
    headers = {
        name: int(time.time()) + VALID_EXPIRY_S if value is None else value
        for name, value in poison.headers.items()
    }
    return publish_raw(
        node, vhost, body=task_body(item), message_id=f"poison-{item}-{uuid.uuid4().hex[:8]}",
        **headers,
    )  # fmt: skip


def dead_letter_count(brokers: Any, queue: str = "celery.dead") -> int:
    """Messages in ``queue`` over all nodes (each copy of a dead letter), without taking them."""
    return sum(sum(depths.get(queue, (0, 0))) for depths in brokers.queue_depths())


def death_of(headers: dict) -> tuple[Any, ...]:
    """What the copies of one dead letter share (a dead letter is published to two brokers):
    the message, when and by whom it was given up."""
    return (headers.get("id"), headers.get("x-beetle-dead-at"), headers.get("x-beetle-dead-worker"))


def take_dead_letters(
    brokers: Any, queue: str = "celery.dead", *, ack: bool = True
) -> dict[str, list[dict]]:
    """Drain ``queue`` on every node (``ack=False``: peek): the headers of each dead letter, by
    task id (a list, so that a message dead-lettered twice shows as two entries; the two
    copies of one dead letter show as one)."""
    found: dict[str, list[dict]] = {}
    seen: set[tuple[Any, ...]] = set()
    for node, depths in zip(brokers.nodes, brokers.queue_depths(), strict=True):
        if queue in depths:
            for _, properties, _ in node.get_messages(brokers.vhost, queue, ack=ack):
                headers = properties.headers or {}
                if death_of(headers) not in seen:
                    seen.add(death_of(headers))
                    found.setdefault(str(headers.get("id")), []).append(headers)
    return found


def stored_dead_letters(brokers: Any, queue: str = "celery.dead") -> int:
    """Dead letters in ``queue`` over all nodes, copies counted once, without taking them."""
    return sum(len(v) for v in take_dead_letters(brokers, queue, ack=False).values())


def celery_queue_empty(brokers: Any, queue: str = "celery") -> bool:
    """Nothing ready or unacked in ``queue`` on any (running) node."""
    return all(depths.get(queue, (0, 0)) == (0, 0) for depths in brokers.queue_depths())


def worker_restarted(log: str) -> list[str]:
    """Signs in a worker's log that it crashed or its consumer restarted."""
    signs = (
        "Unrecoverable error",
        "Frequent restarts detected",
        "Connection to broker lost",
        "consumer: Cannot connect",
    )
    return [sign for sign in signs if sign in log]
