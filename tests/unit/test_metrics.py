"""Metrics: settings, and the gate's counts read at scrape time (no server)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from celery_beetle.metrics import _Merged
from celery_beetle.settings import BeetleSettings
from celery_beetle.store.outcome import Claim
from celery_beetle.worker.metrics import GateCollector

pytest.importorskip("prometheus_client")

URL = "redis://localhost:6379/0"


@pytest.mark.parametrize("port", [-1, 70000, "9100", True, 1.5])
def test_a_metrics_port_that_is_not_a_tcp_port_is_refused(port):
    with pytest.raises(ValueError, match="metrics_port must be a TCP port"):
        BeetleSettings(redis_url=URL, metrics_port=port)


def test_metrics_are_off_unless_a_port_is_set():
    assert BeetleSettings(redis_url=URL).metrics_port is None
    assert BeetleSettings(redis_url=URL, metrics_port=9808).metrics_port == 9808


def _gate(**stats: int) -> SimpleNamespace:
    return SimpleNamespace(
        stats=Counter(stats),
        claims=Counter({Claim.ACQUIRED: 4, Claim.LOCKED: 1}),
        reads=SimpleNamespace(answered=10, waited_s=0.02),
        outage=SimpleNamespace(paused=False, paused_at=0.0, unavailable_s=1.5),
        holding=SimpleNamespace(deferred=2),
        held=0,
    )


def _samples(collector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def test_the_gates_stats_become_counters_by_verdict_when_scraped():
    found = _samples(GateCollector(lambda: _gate(run=5, duplicate=3, deferred=2, error=1)))
    assert found[("beetle_gate_deliveries_total", (("verdict", "run"),))] == 5
    assert found[("beetle_gate_deliveries_total", (("verdict", "duplicate"),))] == 3
    assert found[("beetle_gate_deliveries_total", (("verdict", "error"),))] == 1
    assert found[("beetle_claims_total", (("outcome", "acquired"), ("where", "gate")))] == 4
    assert found[("beetle_store_round_trip_seconds_count", ())] == 10
    assert found[("beetle_store_unavailable_seconds_total", ())] == 1.5
    assert found[("beetle_store_up", ())] == 1
    assert found[("beetle_gate_deferred", ())] == 2


def test_nothing_is_collected_before_the_consumer_made_its_gate():
    assert list(GateCollector(lambda: None).collect()) == []


def test_families_of_one_name_from_two_sources_are_merged_into_one():
    from prometheus_client.core import CounterMetricFamily

    def source(where: str):
        family = CounterMetricFamily("beetle_claims", "x", labels=["where", "outcome"])
        family.add_metric([where, "acquired"], 1)
        return SimpleNamespace(collect=lambda: [family])

    families = list(_Merged([source("gate"), source("pool")]).collect())
    assert [f.name for f in families] == ["beetle_claims"]
    assert len(families[0].samples) == 2


def test_watch_rates_are_the_difference_between_two_scrapes_per_second():
    from celery_beetle.cli.top import Snapshot, rates

    key = ("beetle_gate_deliveries_total", (("verdict", "duplicate"),))
    before = Snapshot(at=10.0, brokers=[], samples={key: 100.0})
    now = Snapshot(at=12.0, brokers=[], samples={key: 150.0})
    assert rates(now, before, "beetle_gate_deliveries_total", "verdict") == {"duplicate": 25.0}
    restarted = Snapshot(at=13.0, brokers=[], samples={key: 3.0})
    assert rates(restarted, now, "beetle_gate_deliveries_total", "verdict") == {"duplicate": 0.0}


def test_a_metrics_port_in_use_stops_the_worker_with_a_clear_error(monkeypatch):
    import socket

    from celery.exceptions import ImproperlyConfigured
    from prometheus_client import CollectorRegistry

    from celery_beetle import metrics
    from celery_beetle.worker.bootstep import BeetleGateStep

    monkeypatch.setattr(
        metrics, "registry_for", lambda collectors, multiprocess: CollectorRegistry()
    )

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        step = SimpleNamespace(
            settings=BeetleSettings(redis_url=URL, metrics_port=port, metrics_addr="127.0.0.1"),
            current_gate=lambda: None,
        )
        with pytest.raises(ImproperlyConfigured, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            BeetleGateStep._serve_metrics(step)  # type: ignore[arg-type]


def test_threads_that_publish_first_at_once_register_the_metrics_once(monkeypatch):
    """Two relays in one process publish their first message together: one registers the
    transport's metrics, the other uses them (the registry refuses a name twice)."""
    import threading
    import time

    from kombu_beetle import metrics as transport_metrics

    made: list[int] = []

    def slow_metrics(prom):
        time.sleep(0.05)  # the window two threads raced through
        made.append(1)
        return SimpleNamespace()

    monkeypatch.setattr(transport_metrics, "_metrics", transport_metrics._UNSET)
    monkeypatch.setattr(transport_metrics, "_Metrics", slow_metrics)
    got: list[object] = []
    threads = [
        threading.Thread(target=lambda: got.append(transport_metrics._get())) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == [1] and len(got) == 8 and len({id(m) for m in got}) == 1
