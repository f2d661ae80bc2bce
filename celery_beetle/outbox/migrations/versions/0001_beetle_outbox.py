"""beetle_outbox and beetle_outbox_aside

Revision ID: beetle_outbox_0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "beetle_outbox_0001"
down_revision = None
branch_labels = ("beetle_outbox",)
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _columns() -> list[sa.Column]:
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
    ]


def upgrade() -> None:
    op.create_table("beetle_outbox", *_columns(), sa.Column("last_error", sa.Text(), nullable=True))
    op.create_index("beetle_outbox_due", "beetle_outbox", ["scheduled_at", "id"])
    op.create_table(
        "beetle_outbox_aside",
        *_columns(),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("moved_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("beetle_outbox_aside")
    op.drop_index("beetle_outbox_due", table_name="beetle_outbox")
    op.drop_table("beetle_outbox")
