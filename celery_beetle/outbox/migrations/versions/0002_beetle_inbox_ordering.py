"""beetle_inbox; ordering keys on beetle_outbox and beetle_outbox_aside

Revision ID: beetle_outbox_0002
Revises: beetle_outbox_0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "beetle_outbox_0002"
down_revision = "beetle_outbox_0001"
branch_labels = None
depends_on = None

_KEYED = sa.text("ordering_key IS NOT NULL")


def upgrade() -> None:
    for table in ("beetle_outbox", "beetle_outbox_aside"):
        op.add_column(table, sa.Column("ordering_key", sa.String(255), nullable=True))
    op.create_index(
        "beetle_outbox_key", "beetle_outbox", ["ordering_key", "id"], postgresql_where=_KEYED
    )
    op.create_index(
        "beetle_outbox_aside_key", "beetle_outbox_aside", ["ordering_key"], postgresql_where=_KEYED
    )
    op.create_table(
        "beetle_inbox",
        sa.Column("scope", sa.String(255), primary_key=True),
        sa.Column("message_id", sa.String(255), primary_key=True),
        sa.Column("step", sa.String(64), primary_key=True, server_default=""),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("beetle_inbox_expires", "beetle_inbox", ["expires_at"])


def downgrade() -> None:
    op.drop_index("beetle_inbox_expires", table_name="beetle_inbox")
    op.drop_table("beetle_inbox")
    op.drop_index("beetle_outbox_aside_key", table_name="beetle_outbox_aside")
    op.drop_index("beetle_outbox_key", table_name="beetle_outbox")
    for table in ("beetle_outbox_aside", "beetle_outbox"):
        op.drop_column(table, "ordering_key")
