"""Enqueueing a task into the outbox, inside the caller's database transaction.

.. code-block:: python

    from celery_beetle import outbox

    with Session(engine) as session, session.begin():
        session.add(Order(id=7, total=42))
        outbox.delay(session, charge, 7)                      # charge.delay(7), in the txn
        outbox.apply_async(session, ship, (7,), countdown=600)  # due in ten minutes

The session is passed explicitly, as ``session.add`` takes the object: the row belongs to
*that* transaction, and nothing hidden (a thread- or context-local "current session") can
put it into another one, or into none when code runs on another thread. A
:class:`~sqlalchemy.orm.Session` or a :class:`~sqlalchemy.engine.Connection` works.

The task goes through its own ``apply_async`` (a :class:`~celery_beetle.BeetleTask` marks it
redundant and makes its id the ``message_id``), with a stand-in producer that writes the
serialized message into ``beetle_outbox`` instead of sending it: routing, serialization,
headers and signals are Celery's own. The task id is a new time-ordered id
(:mod:`~celery_beetle.outbox.ids`), so the row, the task and the dedup record share one id,
and the usual :class:`~celery.result.AsyncResult` is returned.

``countdown`` / ``eta`` become the row's ``scheduled_at``: the task waits in the database,
not in a worker's memory (where Celery's ETA tasks meet ``consumer_timeout`` and quorum
queues), and is relayed when due, without an ``eta``.

Once the transaction commits, an ``enqueued`` trace event is written (with a Session, when
``beetle_trace_dir`` is set), so the audit can tell a committed task that was never relayed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from kombu import Exchange, Queue
from kombu.compression import compress
from kombu.serialization import dumps

from celery_beetle.outbox.ids import new_id
from celery_beetle.outbox.table import OUTBOX
from kombu_beetle.envelope import EXPIRES_AT_HEADER
from kombu_beetle.scopes import parse_dedup_scopes, scope_of

__all__ = ["OutboxError", "apply_async", "delay"]

#: kombu publish arguments that are not message properties
_NOT_PROPERTIES = frozenset({"timeout", "confirm_timeout", "retry", "retry_policy", "mandatory",
                             "immediate"})  # fmt: skip
_PENDING = "beetle_outbox_pending"
DEFAULT_MESSAGE_TTL_S = 86_400.0


class OutboxError(ValueError):
    """A task that cannot be written to the outbox (eager mode, a bad schedule)."""


def delay(session: Any, task: Any, *args: Any, **kwargs: Any) -> Any:
    """``task.delay(*args, **kwargs)`` in ``session``'s transaction; an AsyncResult."""
    return apply_async(session, task, args, kwargs)


def apply_async(
    session: Any,
    task: Any,
    args: Any = None,
    kwargs: Any = None,
    *,
    countdown: float | None = None,
    eta: dt.datetime | None = None,
    ordering_key: str | None = None,
    **options: Any,
) -> Any:
    """``task.apply_async(args, kwargs, **options)`` as a row in ``session``'s transaction.

    Returns the AsyncResult; nothing is published until the transaction commits and the
    relay (``beetle relay``) picks the row up. ``task_id`` may be given (it must be unique:
    it is the dedup identity); by default a time-ordered id is made.

    ``ordering_key``: tasks of one key are published in the order of their ids, each after
    the one before it was confirmed (see ``celery_beetle.outbox.relay`` for what order means between
    concurrent transactions); tasks of other keys are not held back.
    """
    app = task.app
    if app.conf.task_always_eager:
        raise OutboxError("task_always_eager is set: an eager task cannot wait in the outbox")
    now = dt.datetime.now(dt.timezone.utc)
    scheduled_at = _due(now, countdown, eta)
    if ordering_key is not None and (not isinstance(ordering_key, str) or not ordering_key
                                     or len(ordering_key) > 255):  # fmt: skip
        raise OutboxError(f"ordering_key must be text of 1 to 255 characters, got {ordering_key!r}")
    producer = _RowWriter(session, app, task.name, now, scheduled_at, ordering_key)
    options.pop("producer", None)
    options.pop("connection", None)
    task_id = options.pop("task_id", None) or new_id()
    options.setdefault("message_id", task_id)  # the row's id: a relay's republish dedups
    return task.apply_async(args, kwargs, task_id=task_id, producer=producer, **options)


def _due(now: dt.datetime, countdown: float | None, eta: dt.datetime | None) -> dt.datetime:
    if countdown is not None and eta is not None:
        raise OutboxError("give countdown or eta, not both")
    if countdown is not None:
        try:
            return now + dt.timedelta(seconds=float(countdown))
        except (TypeError, ValueError, OverflowError):
            raise OutboxError(f"countdown must be a number of seconds, got {countdown!r}")
    if eta is not None:
        if not isinstance(eta, dt.datetime):
            raise OutboxError(f"eta must be a datetime, got {type(eta).__name__}")
        if eta.tzinfo is None:
            raise OutboxError("eta must be timezone-aware (e.g. datetime.now(timezone.utc))")
        return max(eta, now)
    return now


class _NoConnection:
    """What Celery's ``send_task`` touches on the producer's connection."""

    @contextlib.contextmanager
    def _reraise_as_library_errors(self) -> Iterator[None]:
        yield


class _RowWriter:
    """Stands in for a kombu Producer in Celery's send path: serializes the message as
    kombu would, and inserts it as a row instead of publishing it."""

    connection = _NoConnection()

    def __init__(
        self,
        session: Any,
        app: Any,
        task_name: str,
        now: dt.datetime,
        scheduled_at: dt.datetime,
        ordering_key: str | None = None,
    ) -> None:
        self.session, self.app, self.task_name = session, app, task_name
        self.now, self.scheduled_at = now, scheduled_at
        self.ordering_key = ordering_key

    def publish(
        self,
        body: Any,
        routing_key: str | None = None,
        delivery_mode: Any = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        serializer: str | None = None,
        headers: dict[str, Any] | None = None,
        compression: str | None = None,
        exchange: Any = None,
        declare: Any = None,
        expiration: float | None = None,
        priority: int | None = None,
        **properties: Any,
    ) -> None:
        headers = dict(headers or {})
        if not content_type:
            content_type, content_encoding, data = dumps(body, serializer=serializer or "json")
        else:
            data = body.encode(content_encoding or "utf-8") if isinstance(body, str) else body
            content_encoding = content_encoding or "binary"
        if isinstance(data, str):
            data = data.encode(content_encoding or "utf-8")
        if compression:
            data, headers["compression"] = compress(data, compression)
        # the task waits in the table, not in a worker holding an ETA
        headers["eta"] = None
        conf = self.app.conf
        ttl_s = _message_ttl_s(conf)
        expires_at = self.scheduled_at + dt.timedelta(seconds=ttl_s)
        headers.setdefault(EXPIRES_AT_HEADER, int(expires_at.timestamp()))
        props = {k: v for k, v in properties.items() if k not in _NOT_PROPERTIES and v is not None}
        props["delivery_mode"] = _delivery_mode(exchange, delivery_mode)
        props["content_type"] = content_type
        props["content_encoding"] = content_encoding
        if priority is not None:
            props["priority"] = priority
        if expiration is not None:
            props["expiration"] = str(int(expiration * 1000))
        message_id = str(props.get("message_id") or headers.get("id"))
        props["message_id"] = message_id
        exchange_name = exchange.name if isinstance(exchange, Exchange) else (exchange or "")
        routing_key = routing_key or ""
        row = {
            "id": message_id,
            "task_name": self.task_name,
            "exchange": exchange_name,
            "routing_key": routing_key,
            "body": data,
            "headers": _jsonable(headers),
            "properties": _jsonable(props),
            "declare": [_queue_spec(q) for q in declare or () if isinstance(q, Queue)] or None,
            "scheduled_at": self.scheduled_at,
            "created_at": self.now,
            "expires_at": dt.datetime.fromtimestamp(
                float(headers[EXPIRES_AT_HEADER]), dt.timezone.utc
            ),
            "attempts": 0,
            "ordering_key": self.ordering_key,
        }
        self.session.execute(sa.insert(OUTBOX), [row])
        if conf.get("beetle_outbox_notify"):
            from celery_beetle.outbox.notify import notify

            notify(self.session)
        _trace_after_commit(self.session, conf, message_id, routing_key, self.task_name, headers)


def _message_ttl_s(conf: Any) -> float:
    options = conf.get("broker_transport_options") or {}
    value = options.get("message_ttl", DEFAULT_MESSAGE_TTL_S)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise OutboxError(f"broker_transport_options message_ttl={value!r} is not seconds")


def _delivery_mode(exchange: Any, given: Any) -> int:
    mode = given if given is not None else getattr(exchange, "delivery_mode", None)
    if mode in (None, "persistent"):
        return 2
    if mode == "transient":
        return 1
    return int(mode)


def _queue_spec(queue: Queue) -> dict[str, Any]:
    """What the relay needs to declare ``queue`` as Celery's producer would have."""
    exchange = queue.exchange
    return {
        "name": queue.name,
        "exchange": exchange.name if exchange is not None else "",
        "exchange_type": exchange.type if exchange is not None else "direct",
        "routing_key": queue.routing_key,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "queue_arguments": getattr(queue, "queue_arguments", None) or None,
    }


def queue_from_spec(spec: Mapping[str, Any]) -> Queue:
    exchange = Exchange(spec["exchange"], type=spec.get("exchange_type") or "direct")
    return Queue(
        spec["name"],
        exchange if spec["exchange"] else Exchange(""),
        routing_key=spec.get("routing_key"),
        durable=spec.get("durable", True),
        auto_delete=spec.get("auto_delete", False),
        queue_arguments=spec.get("queue_arguments"),
    )


def _jsonable(value: Any) -> Any:
    """Headers and properties as JSON: tuples become lists (AMQP tables carry both alike);
    a datetime becomes its ISO text, as Celery's own JSON does."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _trace_after_commit(
    session: Any,
    conf: Any,
    message_id: str,
    routing_key: str,
    task_name: str,
    headers: Mapping[str, Any],
) -> None:
    trace_dir = conf.get("beetle_trace_dir")
    if not trace_dir or not hasattr(session, "info") or not hasattr(session, "get_bind"):
        return
    scopes = parse_dedup_scopes(conf.get("beetle_dedup_scopes"))
    pending = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = []
        sa.event.listen(session, "after_commit", _emit_pending)
        sa.event.listen(session, "after_rollback", _drop_pending)
    pending.append((trace_dir, message_id, scope_of(scopes, routing_key), task_name,
                    headers.get("id")))  # fmt: skip


def _emit_pending(session: Any) -> None:
    from kombu_beetle.trace import get_tracer

    pending = session.info.get(_PENDING) or []
    for trace_dir, message_id, scope, task_name, task_id in pending:
        tracer = get_tracer(trace_dir, role="outbox")
        tracer.emit("enqueued", message_id, queue=scope, task_name=task_name, task_id=task_id)
    pending.clear()


def _drop_pending(session: Any) -> None:
    pending = session.info.get(_PENDING)
    if pending:
        pending.clear()
