"""The demo's charges: the ``demo_charges`` table the charge task commits one row to, through
the inbox, and the demo's count of them.

A charge is recorded once when its order has exactly one row, however often its body ran:
the rows, not the runs, are what a crash must not double (:mod:`examples.demo_app`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

CHARGES = sa.Table(
    "demo_charges",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.Integer, nullable=False, index=True),
    sa.Column("pid", sa.Integer, nullable=False),
)


def engine_options(url: str) -> dict[str, Any]:
    """SQLite (no PostgreSQL installed): wait for the other processes' writes."""
    return {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {}


class Charges:
    """The charges committed in the demo's database (its tables created if missing)."""

    def __init__(self, url: str) -> None:
        from celery_beetle.outbox.db import engine_for
        from celery_beetle.outbox.table import create_tables

        self.engine = engine_for(url, **engine_options(url))
        create_tables(self.engine)  # the inbox's table among them
        CHARGES.metadata.create_all(self.engine)

    def recorded(self) -> Counter[int]:
        """Rows per order id."""
        query = sa.select(CHARGES.c.order_id, sa.func.count()).group_by(CHARGES.c.order_id)
        with self.engine.connect() as conn:
            return Counter({int(order): int(n) for order, n in conn.execute(query)})

    def wait_for(self, orders: Iterable[int], timeout: float) -> Counter[int]:
        """Rows per order id, once every one of ``orders`` has one (or at ``timeout``)."""
        wanted = set(orders)
        deadline = time.monotonic() + timeout
        while True:
            recorded = self.recorded()
            if wanted <= set(recorded) or time.monotonic() > deadline:
                return recorded
            time.sleep(0.2)

    def close(self) -> None:
        self.engine.dispose()
