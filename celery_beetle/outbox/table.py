"""The outbox tables (SQLAlchemy Core, so they work with a Session, a Connection or Alembic).

``beetle_outbox`` holds the tasks committed and not yet relayed; a row is deleted once its
publish is confirmed, so the table stays as small as the relay's lag. It is indexed for the
relay's one query: the due rows in order (``scheduled_at, id``).

``beetle_outbox_aside`` holds the rows the relay would not publish (a payload it cannot
send, an exchange or queue that cannot be declared, a row older than the dedup window
after a restore from backup), each with its reason: they wait for an operator
(``beetle outbox list`` / ``beetle outbox retry``) instead of blocking the rows behind them.
A separate table keeps the relay's index free of rows it must skip forever.

Columns: ``id`` is the message id and the Celery task id (:mod:`.ids`, time-ordered);
``body`` the serialized message body as the broker will carry it; ``headers`` and
``properties`` its AMQP application headers and properties (JSON); ``declare`` the queues
Celery would have declared before publishing (JSON, may be empty); ``expires_at`` is the
message's ``x-beetle-expires-at``, fixed at enqueue so that a row relayed again after a
restore carries the same expiry as its first publish; ``ordering_key`` (may be null) puts
the row in a sequence: rows of one key are published one after another in id order
(:mod:`.relay`), and a row of the key set aside holds back the key's later rows.

``beetle_inbox`` (:mod:`.inbox`) holds the message ids whose body committed its effects,
one row per (scope, message id, step), until the dedup window ends (``expires_at``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

__all__ = ["ASIDE", "INBOX", "OUTBOX", "create_tables", "drop_tables", "metadata"]

metadata = sa.MetaData()

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _columns() -> list[sa.Column[object]]:
    return [
        sa.Column("id", sa.Uuid(as_uuid=False), primary_key=True),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("exchange", sa.String(255), nullable=False, server_default=""),
        sa.Column("routing_key", sa.String(255), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("headers", _JSON, nullable=False),
        sa.Column("properties", _JSON, nullable=False),
        sa.Column("declare", _JSON, nullable=True),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("ordering_key", sa.String(255), nullable=True),
    ]


OUTBOX = sa.Table(
    "beetle_outbox",
    metadata,
    *_columns(),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Index("beetle_outbox_due", "scheduled_at", "id"),
    # the heads of the keys, and a key's rows in order
    sa.Index(
        "beetle_outbox_key",
        "ordering_key",
        "id",
        postgresql_where=sa.text("ordering_key IS NOT NULL"),
    ),
)

ASIDE = sa.Table(
    "beetle_outbox_aside",
    metadata,
    *_columns(),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("moved_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index(
        "beetle_outbox_aside_key",
        "ordering_key",
        postgresql_where=sa.text("ordering_key IS NOT NULL"),
    ),
)

INBOX = sa.Table(
    "beetle_inbox",
    metadata,
    sa.Column("scope", sa.String(255), primary_key=True),
    sa.Column("message_id", sa.String(255), primary_key=True),
    sa.Column("step", sa.String(64), primary_key=True, server_default=""),
    sa.Column("task_name", sa.String(255), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("beetle_inbox_expires", "expires_at"),
)

#: columns added after the first release: ``create_tables`` adds them to older tables
_ADDED = (("beetle_outbox", "ordering_key"), ("beetle_outbox_aside", "ordering_key"))


def create_tables(bind: sa.Engine | sa.Connection) -> None:
    """Create the tables if missing, and add the columns of later releases to older ones
    (``beetle outbox init``; Alembic users run the migrations in
    ``celery_beetle/outbox/migrations`` instead)."""
    metadata.create_all(bind)
    if bind.dialect.name == "postgresql":
        with bind.begin() if isinstance(bind, sa.Engine) else _nothing(bind) as conn:
            for table, column in _ADDED:
                conn.execute(sa.text(
                    f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} VARCHAR(255)"
                ))  # fmt: skip
            conn.execute(sa.text(
                "CREATE INDEX IF NOT EXISTS beetle_outbox_key ON beetle_outbox "
                "(ordering_key, id) WHERE ordering_key IS NOT NULL"
            ))  # fmt: skip
            conn.execute(sa.text(
                "CREATE INDEX IF NOT EXISTS beetle_outbox_aside_key ON beetle_outbox_aside "
                "(ordering_key) WHERE ordering_key IS NOT NULL"
            ))  # fmt: skip


@contextlib.contextmanager
def _nothing(conn: sa.Connection) -> Iterator[sa.Connection]:
    yield conn


def drop_tables(bind: sa.Engine | sa.Connection) -> None:
    metadata.drop_all(bind)
