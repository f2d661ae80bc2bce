"""The gate's metrics: its counts, read from the ``stats`` it keeps anyway when Prometheus scrapes.

The worker wing's collector: the gate step hands it to :func:`celery_beetle.metrics.serve`,
which serves it beside the pool's counters (the metrics and their meaning:
:mod:`celery_beetle.metrics`). Nothing is counted on the delivery path for these.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from celery_beetle.worker.verdict import COUNTED

__all__ = ["GateCollector"]


class GateCollector:
    """The gate's counts, read from the ``stats`` it keeps anyway when Prometheus scrapes.

    ``gate()`` returns the worker's :class:`~celery_beetle.worker.gate.DeliveryGate` (None
    before the consumer starts)."""

    def __init__(self, gate: Callable[[], Any]) -> None:
        self.gate = gate

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            SummaryMetricFamily,
        )

        gate = self.gate()
        if gate is None:
            return
        stats = gate.stats
        deliveries = CounterMetricFamily(
            "beetle_gate_deliveries", "Copies the gate looked at, by verdict.", labels=["verdict"]
        )
        for verdict in COUNTED:
            deliveries.add_metric([verdict.value], stats.get(verdict.value, 0))
        yield deliveries
        claims = CounterMetricFamily(
            "beetle_claims", "Claims in Redis by outcome.", labels=["where", "outcome"]
        )
        for outcome, n in gate.claims.items():
            claims.add_metric(["gate", outcome.value], n)
        yield claims
        lost = CounterMetricFamily(
            "beetle_leases_lost", "Runs that found their lease taken over.", labels=["where"]
        )
        lost.add_metric(["gate"], stats.get("lease_lost", 0))
        yield lost
        takeovers = CounterMetricFamily(
            "beetle_lease_takeovers", "Claims over a lease that ran out.", labels=["where"]
        )
        takeovers.add_metric(["gate"], stats.get("taken_over", 0))
        yield takeovers
        reads = gate.reads
        if reads is not None:
            yield SummaryMetricFamily(
                "beetle_store_round_trip_seconds",
                "The gate's Redis requests, from sent to answered.",
                count_value=reads.answered,
                sum_value=reads.waited_s,
            )
        outage = gate.outage
        unavailable = outage.unavailable_s
        if outage.paused:
            unavailable += time.monotonic() - outage.paused_at
        yield GaugeMetricFamily(
            "beetle_store_up",
            "0 while the gate finds Redis unavailable.",
            0 if outage.paused else 1,
        )
        yield CounterMetricFamily(
            "beetle_store_unavailable_seconds",
            "Time the gate spent paused for Redis.",
            unavailable,
        )
        yield CounterMetricFamily(
            "beetle_store_pauses", "Times the gate paused for Redis.", stats.get("pauses", 0)
        )
        yield GaugeMetricFamily(
            "beetle_gate_deferred", "Copies deferred now.", gate.holding.deferred
        )
        yield GaugeMetricFamily(
            "beetle_gate_held", "Copies parked or waiting for a twin now.", gate.held
        )
        yield CounterMetricFamily(
            "beetle_gate_completion_retries",
            "Completions the gate tried again.",
            stats.get("completion_retries", 0),
        )
