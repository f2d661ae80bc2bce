"""Retries with backoff through per-delay queues: no requeue-and-sleep, no busy loop.

A failed run that may be retried comes back after ``delay * 2**n`` (capped at ``max_delay``).
beetle rejected with requeue and slept, which spins the message between broker and worker
and ties up a worker for the whole wait. Here the message is republished, unchanged (same
``message_id`` and task id, same headers, redundant again) to a queue that holds it for
exactly the delay, then dead-letters it back to where it came from::

    <queue>.delay.<ms>   x-message-ttl = ms
                         x-dead-letter-exchange = ""  (the default exchange)
                         x-dead-letter-routing-key = <queue>
                         x-expires = ms + max(ms, 60 s)   (idle delay queues go away)

The delay queue is named after, and dead-letters back to, the physical queue the message was
consumed from, so the retry comes back to the queue it was in (during a migration, the old
queue while it is still consumed). The republished message carries ``x-beetle-scope``, the
dedup scope it ran under: the worker that consumes it again deduplicates it under the scope
of its queue (``beetle_dedup_scopes``), which is the same record while the old and new
queues of a migration share a scope; the header lets an operator (and a replay after the
migration) see which record it belongs to.

One queue per (queue, delay) because RabbitMQ expires messages only at the head of a queue:
mixing delays in one queue would hold a short delay behind a long one. The backoff takes few
distinct values (``delay``, ``2 * delay``, ... up to ``max_delay``), so there are few queues.
The delay queue is declared again before every publish: ``x-expires`` counts from the last
declaration, so a queue in use never expires under a message it still holds.

:class:`RawMessage` and :func:`republish` are shared with the dead-letter queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kombu.serialization import dumps, registry

from celery_beetle.worker.facts import FACTS_HEADER
from kombu_beetle.envelope import REPUBLISHED_HEADER
from kombu_beetle.scopes import SCOPE_HEADER, home_queue

__all__ = [
    "RawMessage",
    "delay_queue_arguments",
    "delay_queue_name",
    "publish_delayed",
    "raw_message_from_request",
    "republish",
]

#: properties of the original message worth keeping on a republished copy
_KEPT_PROPERTIES = ("message_id", "correlation_id", "reply_to", "priority", "delivery_mode")


@dataclass(frozen=True)
class RawMessage:
    """An AMQP message as bytes, headers and properties: what gets republished."""

    body: bytes
    content_type: str
    content_encoding: str
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_delivery(cls, message: Any) -> RawMessage:
        """From a kombu message, as it came in (the gate's own header removed)."""
        properties = dict(message.properties or {})
        headers = dict(message.headers or properties.get("application_headers") or {})
        return cls(
            body=message.body if isinstance(message.body, bytes) else str(message.body).encode(),
            content_type=message.content_type or "application/data",
            content_encoding=message.content_encoding or "binary",
            headers=clean_headers(headers),
            properties={k: properties[k] for k in _KEPT_PROPERTIES if properties.get(k)},
        )


def raw_message_from_request(request: Any, task_name: str, message_id: str) -> RawMessage:
    """A running task's message again, as its publisher sent it, from a Celery request.

    The pool has the headers and properties but not the body's bytes, so the body
    ``(args, kwargs, embed)`` is encoded again with the message's own serializer."""
    properties = getattr(request, "properties", None) or {}
    headers = clean_headers(properties.get("application_headers") or {})
    if not headers:
        headers = {"lang": "py", "task": task_name, "id": request.id}
    content_type = properties.get("content_type") or "application/json"
    serializer = registry.type_to_name.get(content_type, "json")
    embed = {
        "callbacks": request.callbacks,
        "errbacks": request.errbacks,
        "chain": request.chain,
        "chord": request.chord,
    }
    body_args = (list(request.args or ()), dict(request.kwargs or {}), embed)
    ctype, encoding, body = dumps(body_args, serializer=serializer)
    kept = ("correlation_id", "reply_to", "priority", "delivery_mode")
    props = {k: properties[k] for k in kept if properties.get(k)}
    props["message_id"] = message_id
    if isinstance(body, str):
        body = body.encode(encoding or "utf-8")
    return RawMessage(body, ctype, encoding or "binary", headers, props)


def clean_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Headers as the publisher wrote them: without what the gate added on the way in."""
    return {k: v for k, v in headers.items() if k != FACTS_HEADER}


def delay_queue_name(queue: str, delay_ms: int) -> str:
    return f"{queue}.delay.{delay_ms}"


def delay_queue_arguments(queue: str, delay_ms: int) -> dict[str, Any]:
    return {
        "x-message-ttl": delay_ms,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": queue,
        "x-expires": delay_ms + max(delay_ms, 60_000),
    }


def republish(
    producer: Any,
    raw: RawMessage,
    routing_key: str,
    queue_arguments: dict[str, Any] | None = None,
) -> None:
    """Declare ``routing_key`` as a durable queue (with ``queue_arguments``) and publish
    ``raw`` to it through the default exchange, with publisher confirms where the
    connection has them. Raises if the broker(s) cannot take it."""
    producer.channel.queue_declare(
        queue=routing_key, durable=True, auto_delete=False, arguments=queue_arguments or None
    )
    producer.publish(
        raw.body,
        exchange="",
        routing_key=routing_key,
        content_type=raw.content_type,
        content_encoding=raw.content_encoding,
        # a continuation of a traced message (the task traces retried / dead_lettered)
        headers={**raw.headers, REPUBLISHED_HEADER: 1},
        retry=True,
        retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
        **{"delivery_mode": 2, **raw.properties},
    )


def publish_delayed(
    producer: Any, raw: RawMessage, queue: str, delay_ms: int, scope: str | None = None
) -> str:
    """Send ``raw`` back to ``queue`` after ``delay_ms``, marked with its dedup ``scope``
    (None: the queue's name); returns the queue it went to.

    A zero delay goes straight back to ``queue``. A message consumed from a migration's
    temporary queue goes back to the queue it stands in for (:func:`home_queue`)."""
    queue = home_queue(queue)
    raw = replace(raw, headers={**raw.headers, SCOPE_HEADER: scope or queue})
    if delay_ms <= 0:
        republish(producer, raw, queue)
        return queue
    name = delay_queue_name(queue, delay_ms)
    republish(producer, raw, name, delay_queue_arguments(queue, delay_ms))
    return name
