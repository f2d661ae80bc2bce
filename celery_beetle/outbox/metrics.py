"""The outbox's backlog as Prometheus gauges, read from its database when Prometheus scrapes.

The outbox wing's collector: register it in the relay's process,
``prometheus_client.REGISTRY.register(OutboxCollector(engine))`` (the metrics and their
meaning: :mod:`celery_beetle.metrics`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery_beetle.outbox.table import ASIDE, OUTBOX

__all__ = ["OutboxCollector"]

logger = logging.getLogger(__name__)


class OutboxCollector:
    """The outbox's backlog, queried when Prometheus scrapes (register it in the relay's
    process: ``prometheus_client.REGISTRY.register(OutboxCollector(engine))``)."""

    def __init__(self, engine: Any, clock: Callable[[], float] = time.time) -> None:
        self.engine, self.clock = engine, clock

    def collect(self) -> Iterator[Any]:
        import sqlalchemy as sa
        from prometheus_client.core import GaugeMetricFamily

        try:
            with self.engine.connect() as conn:
                pending, oldest = conn.execute(
                    sa.select(sa.func.count(), sa.func.min(OUTBOX.c.created_at))
                ).one()
                aside = conn.execute(sa.select(sa.func.count()).select_from(ASIDE)).scalar_one()
        except Exception as exc:  # a scrape must not fail for a database hiccup
            logger.warning("beetle: cannot read the outbox for metrics: %r", exc)
            return
        if oldest is not None and oldest.tzinfo is None:  # stored in UTC (timezone=True)
            oldest = oldest.replace(tzinfo=dt.timezone.utc)
        age = self.clock() - oldest.timestamp() if oldest is not None else 0.0
        yield GaugeMetricFamily("beetle_outbox_pending_rows", "Rows in the outbox.", pending)
        yield GaugeMetricFamily(
            "beetle_outbox_oldest_pending_age_seconds", "Age of the oldest outbox row.", age
        )
        yield GaugeMetricFamily("beetle_outbox_aside_rows", "Outbox rows set aside.", aside)
