"""Prometheus metrics of a worker: gate verdicts, claims, runs, retries, dead letters, Redis.

Turned on by ``app.conf.beetle_metrics_port`` (and ``beetle_metrics_addr``, default
``0.0.0.0``), with ``prometheus_client`` installed (``pip install kombu-beetle[metrics]``):
the worker's main process then serves ``http://host:port/metrics``. Off (the default),
nothing is counted: each hook is a call that finds no metrics and returns.

**Prefork: one scrape sums the pool.** The pool's processes count in prometheus_client's
*multiprocess mode*: each writes its counters to memory-mapped files in
``PROMETHEUS_MULTIPROC_DIR`` (the worker sets one, ``<tmp>/beetle-metrics-<pid>``, and
empties it at start unless the environment names one already: then one directory per
worker, emptied before it starts, is the operator's to give), and the main process sums
the files of every process at scrape time. Aggregation in the main process was the other
choice; it needs a channel from each pool process to the main one and loses what a pool
process counted since its last report when it is killed (-9 or a time limit), which is
exactly when the numbers matter. The files outlive their process, so a killed process's
counts stay in the sum. The gate's own counts cost nothing on the delivery path: they are
the ``stats`` the gate keeps anyway, read at scrape time by the worker wing's collector
(:class:`~celery_beetle.worker.metrics.GateCollector`), which the gate step hands to
:func:`serve`; the outbox wing has its own
(:class:`~celery_beetle.outbox.metrics.OutboxCollector`). This module knows neither: the
hooks below, and the serving.

Worker metrics (the transport's, ``beetle_copies_published_total`` and ``beetle_broker_*``,
are in :mod:`kombu_beetle.metrics` and served by the same endpoint):

==============================================  ===============================================
``beetle_gate_deliveries_total{verdict}``       copies the gate looked at, by what it did:
                                                ``run`` (to the pool), ``duplicate`` (acked and
                                                dropped: another copy ran), ``deferred``,
                                                ``expired``, ``parked`` (Redis unavailable),
                                                ``waiting`` (its twin is running here),
                                                ``bad_input``, ``unknown_task``,
                                                ``handed_back``, ``error``
``beetle_claims_total{where,outcome}``          claims in Redis by the ``gate`` (its batch) or
                                                the ``pool``: ``acquired``, ``already_done``,
                                                ``locked``, ``delayed``, ``dead_letter``,
                                                ``expired``
``beetle_task_started_total{queue,task}``       bodies started (queue: the dedup scope)
``beetle_task_completed_total{queue,task}``     completions stored
``beetle_task_failed_total{queue,task}``        bodies that raised
``beetle_task_retried_total{queue,task}``       retries scheduled
``beetle_dead_letters_total{queue,reason}``     messages dead-lettered (given up, bad input)
``beetle_task_runtime_seconds{queue,task}``     histogram of successful bodies' run time
``beetle_lease_takeovers_total{where}``         claims over another run's lease that ran
                                                out: its worker died mid-task (or outlived
                                                the lease), and the message runs again
``beetle_leases_lost_total{where}``             runs that found their lease taken over (a
                                                slow run; the taker ran the message again)
``beetle_store_round_trip_seconds``             summary (sum, count) of the gate's Redis
                                                requests, from sent to answered
``beetle_store_up``                             0 while the gate finds Redis unavailable
``beetle_store_unavailable_seconds_total``      time the gate spent paused for Redis
``beetle_store_pauses_total``                   times it paused
``beetle_gate_deferred``                        copies deferred now
``beetle_gate_held``                            copies parked or waiting for a twin now
``beetle_gate_completion_retries_total``        completions tried again (Redis failed)
``beetle_outbox_pending_rows``                  rows in the outbox (``OutboxCollector``)
``beetle_outbox_oldest_pending_age_seconds``    age of its oldest row
``beetle_outbox_aside_rows``                    rows set aside
==============================================  ===============================================

Labels are bounded (queue, task, broker, outcome, verdict, reason): never a message id.

:May import: ``kombu_beetle``, ``celery_beetle._moved``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from celery_beetle import _moved
from kombu_beetle import metrics as transport_metrics

__all__ = [
    "activate",
    "dead_lettered",
    "lease_lost",
    "pool_claim",
    "prepare_multiprocess",
    "serve",
    "task_completed",
    "task_event",
    "task_runtime",
]

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: task run time buckets, seconds: Celery tasks run from milliseconds to many minutes
RUNTIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)


class _Metrics:
    def __init__(self, prom: Any) -> None:
        task = ["queue", "task"]
        self.started = prom.Counter("beetle_task_started", "Task bodies started.", task)
        self.completed = prom.Counter("beetle_task_completed", "Completions stored.", task)
        self.failed = prom.Counter("beetle_task_failed", "Task bodies that raised.", task)
        self.retried = prom.Counter("beetle_task_retried", "Retries scheduled.", task)
        self.dead = prom.Counter(
            "beetle_dead_letters", "Messages dead-lettered.", ["queue", "reason"]
        )
        self.claims = prom.Counter(
            "beetle_claims", "Claims in Redis by outcome.", ["where", "outcome"]
        )
        self.lease_lost = prom.Counter(
            "beetle_leases_lost", "Runs that found their lease taken over.", ["where"]
        )
        self.takeovers = prom.Counter(
            "beetle_lease_takeovers", "Claims over a lease that ran out.", ["where"]
        )
        self.runtime = prom.Histogram(
            "beetle_task_runtime_seconds",
            "Run time of successful task bodies.",
            task,
            buckets=RUNTIME_BUCKETS,
        )
        self.by_event = {"started": self.started, "failed": self.failed, "retried": self.retried}
        self._children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found


#: None until :func:`activate`: a worker without metrics counts nothing
_metrics: _Metrics | None = None
_creating = threading.Lock()


def activate() -> None:
    """Count from now on (the worker's step calls it before the pool forks, so the pool's
    processes count too). Raises ImportError without prometheus_client."""
    global _metrics
    with _creating:  # once, whichever thread asks first
        if _metrics is None:
            import prometheus_client

            _metrics = _Metrics(prometheus_client)


def _get() -> _Metrics | None:
    return _metrics


# -- recording (pool processes, and the gate's completions) -----------------------------------


def task_event(event: str, queue: str, task: str | None, detail: dict[str, Any] | None) -> None:
    """A run's trace event (:meth:`celery_beetle.worker.run.Run._trace`), counted."""
    m = _get()
    if m is None:
        return
    if event == "completed":
        m.child(m.completed, queue, task or "").inc()
    elif event == "dead_lettered":
        m.child(m.dead, queue, str((detail or {}).get("reason") or "unknown")).inc()
    else:
        metric = m.by_event.get(event)
        if metric is not None:
            m.child(metric, queue, task or "").inc()


def task_completed(queue: str, task: str | None) -> None:
    """A completion the gate stored (the pool's come through :func:`task_event`)."""
    m = _get()
    if m is not None:
        m.child(m.completed, queue, task or "").inc()


def task_runtime(queue: str, task: str, seconds: float) -> None:
    m = _get()
    if m is not None:
        m.child(m.runtime, queue, task).observe(seconds)


def pool_claim(outcome: str) -> None:
    m = _get()
    if m is not None:
        m.child(m.claims, "pool", outcome).inc()


def lease_taken_over() -> None:
    """The pool claimed over another run's lease that ran out."""
    m = _get()
    if m is not None:
        m.child(m.takeovers, "pool").inc()


def lease_lost(where: str) -> None:
    m = _get()
    if m is not None:
        m.child(m.lease_lost, where).inc()


def dead_lettered(queue: str, reason: str) -> None:
    """A bad input the gate dead-lettered (the pool's come through :func:`task_event`)."""
    m = _get()
    if m is not None:
        m.child(m.dead, queue, reason).inc()


# -- read at scrape time -------------------------------------------------------------------------


class _Merged:
    """Every source's families, those of one name merged: the gate's claims and the pool's
    share ``beetle_claims_total``, and an exposition must name a family once."""

    def __init__(self, sources: Iterable[Any]) -> None:
        self.sources = list(sources)

    def collect(self) -> Iterator[Any]:
        families: dict[str, Any] = {}
        for source in self.sources:
            for family in source.collect():
                found = families.get(family.name)
                if found is None:
                    families[family.name] = family
                else:
                    found.samples.extend(family.samples)
        yield from families.values()


# -- serving (the worker's main process) ---------------------------------------------------------


def prepare_multiprocess(directory: str | None = None) -> str:
    """Make this process and the pool processes it forks count into ``directory``'s files.

    Must run before a pool process is forked. The environment's
    ``PROMETHEUS_MULTIPROC_DIR`` wins (the operator chose it and cleans it); otherwise a
    directory of this worker's own is made, emptied of an earlier run's files."""
    chosen = os.environ.get(MULTIPROC_ENV) or directory
    if not chosen:
        chosen = os.path.join(tempfile.gettempdir(), f"beetle-metrics-{os.getpid()}")
        shutil.rmtree(chosen, ignore_errors=True)
    os.makedirs(chosen, exist_ok=True)
    os.environ[MULTIPROC_ENV] = chosen
    from prometheus_client import values

    # prometheus_client picks its value class at import; a metric made from now on writes
    # to the files (each counter's value is made at its first label set, so none is lost)
    values.ValueClass = values.get_value_class()
    activate()
    return chosen


def registry_for(collectors: Iterable[Any], multiprocess: bool) -> Any:
    """The worker's registry: the pool's files summed (or this process's counters) and the
    ``collectors`` a wing brings (the gate's counts, :mod:`celery_beetle.worker.metrics`),
    merged by family name."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    source = MultiProcessCollector(None) if multiprocess else REGISTRY
    registry.register(_Merged([source, *collectors]))
    return registry


def serve(port: int, addr: str, collectors: Iterable[Any], multiprocess: bool) -> Any:
    """Serve the worker's metrics on ``addr:port`` from a daemon thread, with the
    ``collectors`` the caller's wing registers (read at scrape time)."""
    from prometheus_client import start_http_server

    transport_metrics.enabled()  # the transport's families exist before the first scrape
    activate()
    registry = registry_for(collectors, multiprocess)
    server = start_http_server(port, addr, registry=registry)
    logger.info("beetle: metrics on http://%s:%d/metrics", addr, port)
    return server


if not TYPE_CHECKING:  # moved into their wings: read with a DeprecationWarning until 0.2.0
    __getattr__ = _moved.names_moved_from(__name__)
