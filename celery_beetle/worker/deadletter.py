"""The dead-letter queue: where a message goes when it will not run again.

A message is dead-lettered when its task gives up (past ``attempts`` or ``exceptions``, or an
exception not in ``retry_on``: :class:`~celery_beetle.store.outcome.GiveUpReason`), or when the
worker cannot even gate it (no ``message_id``, a body that does not decode, an unknown task:
:class:`~celery_beetle.worker.gate.BadInput`). It goes to ``<queue>.dead``, a plain durable queue
declared on first use, with its body, headers and properties unchanged and these headers
added, so an operator can see why without reading worker logs:

===========================  ==============================================================
``x-beetle-dead-reason``     ``attempts_limit``, ``exceptions_limit``, ``not_retryable``,
                             ``no_message_id``, ``undecodable``, ``unknown_task``
``x-beetle-dead-queue``      the queue it was consumed from (where a replay sends it)
``x-beetle-dead-scope``      its dedup scope (:mod:`kombu_beetle.scopes`): with
                             ``message_id``, the record a replay is deduplicated under,
                             also after a migration moved the scope to another queue
``x-beetle-dead-exception``  the exception's type (module-qualified) and
``x-beetle-dead-message``    its message (at most 1000 characters)
``x-beetle-dead-traceback``  the last frames, one ``file:line in function`` per line
``x-beetle-dead-attempts``   runs so far, and ``x-beetle-dead-exceptions``: failures so far
``x-beetle-dead-at``         when, unix ms; ``x-beetle-dead-worker``: who
``x-beetle-dead-flags``      the original ``x-beetle-flags``; ``x-beetle-dead-expires-at``:
                             the original ``x-beetle-expires-at`` (a replay gets a new one)
===========================  ==============================================================

The dead letter is published redundantly, to two brokers, like the message it stands for:
losing a broker for good loses no dead letter. Both copies carry the same headers (the same
``x-beetle-dead-at`` and ``-worker``), so the operator's tools
(:mod:`celery_beetle.ops.dead_letters`) show them as one dead letter and remove both when it
is replayed or purged; a replay runs it once however many copies there are.
``x-beetle-dead-flags`` keeps the original flags (the dead letter's own ``x-beetle-flags``
say "redundant").
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from typing import Any

from celery_beetle import metrics
from celery_beetle.store.health import call_until_stored
from celery_beetle.store.state import MessageFacts
from celery_beetle.worker.errors import HandBack
from celery_beetle.worker.retry_queue import RawMessage, republish
from kombu_beetle.envelope import EXPIRES_AT_HEADER, FLAG_REDUNDANT, FLAGS_HEADER
from kombu_beetle.scopes import home_queue

__all__ = [
    "DEAD_HEADERS",
    "OwedDeadLetter",
    "dead_letter_delivery",
    "dead_letter_headers",
    "dead_letter_queue_name",
    "publish_dead_letter",
]

logger = logging.getLogger(__name__)

PREFIX = "x-beetle-dead-"
DEAD_HEADERS = tuple(
    PREFIX + name
    for name in (
        "reason",
        "queue",
        "scope",
        "exception",
        "message",
        "traceback",
        "attempts",
        "exceptions",
        "at",
        "worker",
        "flags",
        "expires-at",
    )
)
_MAX_MESSAGE = 1000
_MAX_FRAMES = 8


def dead_letter_queue_name(queue: str) -> str:
    """``<queue>.dead``; a migration's temporary queue uses its home queue's."""
    return f"{home_queue(queue)}.dead"


def dead_letter_headers(
    reason: str,
    queue: str,
    exc: BaseException | None = None,
    *,
    detail: str = "",
    attempts: int | None = None,
    exceptions: int | None = None,
    worker: str | None = None,
    now_ms: int | None = None,
    scope: str | None = None,
) -> dict[str, Any]:
    """The ``x-beetle-dead-*`` headers for a message from ``queue`` given up for ``reason``
    (``scope``: its dedup scope, None for the queue's name)."""
    headers: dict[str, Any] = {
        PREFIX + "reason": reason,
        # the queue a replay goes back to: never a migration's temporary queue
        PREFIX + "queue": home_queue(queue),
        PREFIX + "scope": scope or home_queue(queue),
        PREFIX + "at": now_ms if now_ms is not None else time.time_ns() // 1_000_000,
        PREFIX + "worker": worker or f"{socket.gethostname()}:{os.getpid()}",
    }
    if exc is not None:
        cls = type(exc)
        headers[PREFIX + "exception"] = f"{cls.__module__}.{cls.__qualname__}"
        headers[PREFIX + "message"] = str(exc)[:_MAX_MESSAGE]
        headers[PREFIX + "traceback"] = traceback_summary(exc)
    elif detail:
        headers[PREFIX + "message"] = detail[:_MAX_MESSAGE]
    if attempts is not None:
        headers[PREFIX + "attempts"] = attempts
    if exceptions is not None:
        headers[PREFIX + "exceptions"] = exceptions
    return headers


def traceback_summary(exc: BaseException) -> str:
    """The innermost frames, short enough for a header (RabbitMQ keeps headers in memory)."""
    frames = traceback.extract_tb(exc.__traceback__)[-_MAX_FRAMES:]
    return "\n".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames)


def publish_dead_letter(
    producer: Any, raw: RawMessage, queue: str, dead_headers: dict[str, Any]
) -> str:
    """Publish ``raw`` to ``<queue>.dead`` with ``dead_headers``, redundantly; returns the
    queue name."""
    headers = dict(raw.headers)
    flags = headers.pop(FLAGS_HEADER, None)
    if flags is not None:
        headers[PREFIX + "flags"] = flags
    # kept as evidence under another name: a publisher's expiry may be the very reason it is
    # here (``inf``, a list), and the redundant publish would refuse it
    expires_at = headers.pop(EXPIRES_AT_HEADER, None)
    if expires_at is not None:
        headers[PREFIX + "expires-at"] = expires_at
    headers.update(dead_headers)
    headers[FLAGS_HEADER] = FLAG_REDUNDANT  # two copies, on two brokers
    name = dead_letter_queue_name(queue)
    republish(
        producer,
        RawMessage(raw.body, raw.content_type, raw.content_encoding, headers, raw.properties),
        name,
    )
    return name


def dead_letter_delivery(
    app: Any, message: Any, queue: str, reason: str, detail: str, scope: str | None = None
) -> None:
    """Publish a delivery the gate cannot take to ``<queue>.dead`` (main process)."""
    raw = RawMessage.from_delivery(message)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    headers = dead_letter_headers(reason, queue, detail=detail, worker=worker, scope=scope)
    with app.producer_or_acquire() as producer:
        publish_dead_letter(producer, raw, queue, headers)
    metrics.dead_lettered(scope or queue, reason)


class OwedDeadLetter:
    """The dead letter a run in the pool owes for ``facts``, published from ``raw``.

    If it cannot be published the delivery is handed back (:class:`~.errors.HandBack`).
    The record keeps it owed, and after the owner's lease another copy publishes it.
    """

    def __init__(
        self, app: Any, store: Any, facts: MessageFacts, raw: RawMessage, worker: str, name: str
    ) -> None:
        self.app = app
        self.store = store
        self.facts = facts
        self.raw = raw
        self.worker = worker
        self.name = name

    def publish(
        self, reason: str, exc: BaseException, attempts: int | None, exceptions: int | None
    ) -> None:
        """Publish it to ``<queue>.dead``, or hand the delivery back."""
        facts = self.facts
        headers = dead_letter_headers(
            reason,
            facts.queue,
            exc,
            attempts=attempts,
            exceptions=exceptions,
            worker=self.worker,
            scope=facts.scope,
        )
        try:
            with self.app.producer_or_acquire() as producer:
                publish_dead_letter(producer, self.raw, facts.queue, headers)
        except Exception as pub_exc:
            logger.error(
                "beetle: could not dead-letter %s (%s): %r; handing it back",
                self.name,
                reason,
                pub_exc,
            )
            raise HandBack(f"dead letter not published: {pub_exc!r}", 5.0) from pub_exc

    def mark_stored(self) -> None:
        """Mark it published in the record, retried until stored."""
        call_until_stored(
            lambda _: self.store.dead_lettered(self.facts), f"that {self.name} is dead-lettered"
        )
