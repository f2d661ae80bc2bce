"""Alembic environment for running the outbox migration on its own.

Projects with their own Alembic setup do not need this file: they add
``celery_beetle/outbox/migrations/versions`` to ``version_locations`` and run
``alembic upgrade beetle_outbox@head`` (the revision carries the branch label
``beetle_outbox``). Standalone: :func:`celery_beetle.outbox.migrate.upgrade`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

config = context.config
connectable = config.attributes.get("connection")

if connectable is None:
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {},
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        context.configure(connection=connection, version_table="beetle_outbox_alembic")
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connectable, version_table="beetle_outbox_alembic")
    with context.begin_transaction():
        context.run_migrations()
