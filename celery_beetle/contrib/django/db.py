"""Writing outbox and inbox rows through a Django connection, inside its atomic block."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from django.db import connections

from celery_beetle.outbox.enqueue import OutboxError
from celery_beetle.outbox.inbox import InboxError, committing, inbox_row, skipped
from celery_beetle.outbox.notify import CHANNEL
from celery_beetle.outbox.table import OUTBOX

__all__ = ["DjangoWriter", "mark_once"]


def _atomic(using: str, what: str, error: type[Exception]) -> Any:
    connection = connections[using]
    if not connection.in_atomic_block:
        raise error(
            f"{what} runs inside transaction.atomic(using={using!r}): in autocommit its row "
            "would commit on its own, apart from the data it belongs with"
        )
    return connection


class DjangoWriter:
    """What :func:`celery_beetle.outbox.enqueue.apply_async` needs of a session: an
    ``execute`` for its two statements (the row's insert, the optional NOTIFY)."""

    def __init__(self, using: str, what: str) -> None:
        self.using = using
        self.connection = _atomic(using, what, OutboxError)

    def execute(self, statement: Any, params: Any = None) -> None:
        if isinstance(statement, sa.Insert) and statement.table is OUTBOX:
            from celery_beetle.contrib.django.models import OutboxRow

            OutboxRow.objects.using(self.using).bulk_create([OutboxRow(**row) for row in params])
        elif "pg_notify" in str(statement):
            with self.connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])
        else:
            raise TypeError(f"unexpected statement for the Django outbox: {statement}")


def mark_once(request: Any, *, step: str, using: str, app: Any) -> bool:
    """:func:`celery_beetle.outbox.inbox.once` through Django's connection ``using``."""
    row = inbox_row(request, step, app)
    if row is None:
        return True
    connection = _atomic(using, "inbox_once", InboxError)
    committing(request)
    columns = list(row)
    sql = (
        f"INSERT INTO beetle_inbox ({', '.join(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))}) "
        "ON CONFLICT DO NOTHING RETURNING message_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [row[c] for c in columns])
        inserted = cursor.fetchone() is not None
    if not inserted:
        skipped(row)
    return inserted
