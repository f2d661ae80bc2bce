"""Running the shipped Alembic migration from Python (tests, ``beetle outbox init --alembic``).

The migration is in ``migrations/versions``; its revision has the branch label
``beetle_outbox``, so it can live beside a project's own revisions.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

__all__ = ["MIGRATIONS", "upgrade"]

MIGRATIONS = Path(__file__).parent / "migrations"


def upgrade(bind: sa.Engine, revision: str = "beetle_outbox@head") -> None:
    """Apply the outbox migration to ``bind`` (version table ``beetle_outbox_alembic``)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with bind.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
