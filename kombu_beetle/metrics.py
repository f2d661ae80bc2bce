"""Prometheus metrics of the transport: copies published per broker, brokers up and down.

Optional: with ``prometheus_client`` installed (the ``metrics`` extra) every process that
uses ``beetle://`` counts into prometheus_client's default registry; without it every call
here is a no-op costing one attribute check, and the transport works as before. Nothing is
served from here: a worker serves these through :mod:`celery_beetle.metrics`, a publisher
through its own ``prometheus_client.start_http_server()`` (or whatever its web framework
exposes), as both read the same registry.

================================================  ==============================================
``beetle_copies_published_total{broker,outcome}``  copies written to a broker and settled:
                                                   ``confirmed``, ``nacked`` (the broker refused
                                                   a copy of that message) or ``failed`` (write
                                                   error, confirm timeout, connection lost)
``beetle_messages_published_total{outcome}``       messages published: ``redundant`` (every copy
                                                   wanted), ``degraded`` (a redundant message on
                                                   fewer brokers than wanted), ``single`` (a
                                                   message that wants one copy: events, replies)
                                                   or ``failed`` (no broker took it)
``beetle_broker_up{broker}``                       1 while this process's link to the broker is
                                                   up, 0 while it is down (a worker: the value
                                                   its processes set last)
``beetle_broker_down_total{broker}``               links that went down
``beetle_broker_reconnects_total{broker}``         links that came back
================================================  ==============================================

Labels are bounded: a broker is a ``host:port`` of the URL, an outcome one of the words above.
The children of each label set are cached, so a publish costs a dict lookup and an increment
per copy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["broker_down", "broker_up", "enabled", "published"]


class _Metrics:
    def __init__(self, prom: Any) -> None:
        self.copies = prom.Counter(
            "beetle_copies_published",
            "Copies of messages settled per broker: confirmed, nacked or failed.",
            ["broker", "outcome"],
        )
        self.messages = prom.Counter(
            "beetle_messages_published",
            "Messages published: redundant, degraded (fewer copies than wanted), single, failed.",
            ["outcome"],
        )
        self.up = prom.Gauge(
            "beetle_broker_up",
            "1 while the link to the broker is up, 0 while it is down.",
            ["broker"],
            multiprocess_mode="mostrecent",
        )
        self.down = prom.Counter(
            "beetle_broker_down", "Links to a broker that went down.", ["broker"]
        )
        self.reconnects = prom.Counter(
            "beetle_broker_reconnects", "Links to a broker that came back.", ["broker"]
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found


_UNSET: Any = object()
_metrics: Any = _UNSET
#: Two threads' first publishes (two relays in one process) must not both register the
#: metrics: the registry refuses a name twice, and the loser's publish would fail.
_creating = threading.Lock()


def _get() -> _Metrics | None:
    global _metrics
    if _metrics is _UNSET:
        with _creating:
            if _metrics is _UNSET:
                try:
                    import prometheus_client
                except ImportError:
                    _metrics = None
                else:
                    _metrics = _Metrics(prometheus_client)
    return _metrics


def enabled() -> bool:
    """Whether prometheus_client is installed, so that these metrics count."""
    return _get() is not None


def published(
    done: Iterable[Any], failed: Iterable[str], nacked: bool, redundant: bool, wanted: int
) -> None:
    """One message settled: the links in ``done`` confirmed a copy, the brokers named in
    ``failed`` did not."""
    m = _metrics if _metrics is not _UNSET else _get()
    if m is None:
        return
    confirmed = 0
    for link in done:
        m.child(m.copies, link.name, "confirmed").inc()
        confirmed += 1
    outcome = "nacked" if nacked else "failed"
    for name in failed:
        m.child(m.copies, name, outcome).inc()
    if not confirmed:
        kind = "failed"
    elif not redundant:
        kind = "single"
    else:
        kind = "redundant" if confirmed >= wanted else "degraded"
    m.child(m.messages, kind).inc()


def broker_down(name: str) -> None:
    m = _get()
    if m is not None:
        m.child(m.up, name).set(0)
        m.child(m.down, name).inc()


def broker_up(name: str, reconnected: bool) -> None:
    m = _get()
    if m is not None:
        m.child(m.up, name).set(1)
        if reconnected:
            m.child(m.reconnects, name).inc()
