"""Metrics: a real prefork worker's scrape equals what the trace and its audit count."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from celery_beetle.audit.naive import audit, expand
from celery_beetle.testing.ports import free_port
from celery_beetle.testing.rabbit import beetle_url
from celery_beetle.testing.waiting import wait_until
from kombu_beetle.trace import flush_all
from tests.exactly_once.conftest import counts

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

OPTIONS = {"attempts": 3, "exceptions": 2, "retry_delay": 0.2, "max_delay": 1}


def scrape(port: int) -> list[Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def total(samples: list[Any], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def published_locally() -> dict[str, float]:
    """This process's publishes (the test's publisher) from the default registry."""
    samples = [s for f in prometheus_client.REGISTRY.collect() for s in f.samples]
    found = {
        outcome: total(samples, "beetle_messages_published_total", outcome=outcome)
        for outcome in ("redundant", "degraded", "failed")
    }
    found["copies"] = total(samples, "beetle_copies_published_total")
    return found


def trace_events(trace: Path) -> tuple[Counter[str], set[str]]:
    """Events by name, and the ids of the messages published."""
    found: Counter[str] = Counter()
    published: set[str] = set()
    for path in expand([str(trace)]):
        for line in Path(path).read_text().splitlines():
            event = json.loads(line)
            found[event["event"]] += 1
            if event["event"] == "published":
                published.add(event["message_id"])
    return found, published


def test_a_prefork_workers_scrape_equals_the_audits_counts_after_a_broker_is_cut(
    brokers, client, eo_worker, tcp_proxy, tmp_path
):
    proxy = tcp_proxy(brokers.nodes[2])
    url = beetle_url(
        [brokers.nodes[0].host_port, brokers.nodes[1].host_port, proxy.host_port], brokers.vhost
    )
    trace = tmp_path / "trace"
    trace.mkdir()
    port = free_port()
    conf = {"beetle_metrics_port": port, "beetle_metrics_addr": "127.0.0.1"}
    worker = eo_worker(
        url=url,
        pool="prefork",
        concurrency=2,
        trace_dir=str(trace),
        task_options=OPTIONS,
        extra_env={"BEETLE_TEST_CONF": json.dumps(conf)},
    )
    app = client(url=url, task_options=OPTIONS, trace_dir=str(trace))
    before = published_locally()
    for item in range(20):
        app.tasks["eo.record"].delay(item)
    for item in range(100, 103):
        app.tasks["eo.flaky"].delay(item)  # 3 runs each: 2 retries, then a dead letter
    assert wait_until(lambda: len(counts([worker])) >= 5, timeout=20)
    proxy.cut()
    for item in range(20, 40):
        app.tasks["eo.record"].delay(item)
    assert wait_until(lambda: len(counts([worker])) == 40, timeout=40)
    proxy.restore()

    def settled() -> bool:
        s = scrape(port)
        return (
            total(s, "beetle_dead_letters_total") == 3
            and total(s, "beetle_gate_deferred") == 0
            and total(s, "beetle_gate_held") == 0
            and total(s, "beetle_broker_reconnects_total") >= 1
        )

    assert wait_until(settled, timeout=40)
    time.sleep(1.5)  # copies of the cut broker come back and are dropped
    samples = scrape(port)
    assert wait_until(lambda: scrape(port) == samples, timeout=20, interval=1.0)
    samples = scrape(port)
    worker.stop()  # warm: the worker's trace files are written
    flush_all()  # and the publisher's

    summary = audit(expand([str(trace)]))
    events, published = trace_events(trace)
    assert summary["completed_once"] == 40 and summary["dead_lettered"] == 3
    assert summary["lost"] == summary["duplicated"] == 0
    assert total(samples, "beetle_task_completed_total") == summary["completed_once"]
    assert total(samples, "beetle_dead_letters_total", reason="attempts_limit") == 3
    assert total(samples, "beetle_task_retried_total") == summary["retries"] == 6
    assert total(samples, "beetle_task_started_total") == events["started"] == 49
    assert total(samples, "beetle_task_failed_total") == events["failed"] == 9
    duplicates = total(samples, "beetle_gate_deliveries_total", verdict="duplicate") + total(
        samples, "beetle_claims_total", where="pool", outcome="already_done"
    )
    assert duplicates == events["duplicate"] > 0
    assert total(samples, "beetle_gate_deliveries_total", verdict="expired") == events["expired"]
    proxied = proxy.host_port
    assert total(samples, "beetle_broker_down_total", broker=proxied) >= 1
    assert total(samples, "beetle_broker_up", broker=proxied) == 1
    assert total(samples, "beetle_task_runtime_seconds_count") >= 40
    assert total(samples, "beetle_store_round_trip_seconds_count") > 0

    after = published_locally()
    redundant = sum(after[k] - before[k] for k in ("redundant", "degraded"))
    assert redundant == len(published) == 43
    assert after["copies"] - before["copies"] == events["published"]  # one event per copy


def test_a_worker_killed_mid_task_shows_as_one_lease_takeover_in_the_heirs_scrape(
    brokers, client, eo_worker
):
    lease = {"timeout": 3, "attempts": 2, "exceptions": 1}
    doomed = eo_worker(task_options=lease)
    app = client(task_options=lease)
    app.tasks["eo.record"].delay(1, 30)
    assert wait_until(lambda: counts([doomed], "start")[1] == 1, timeout=20)
    doomed.kill()
    port = free_port()
    conf = {"beetle_metrics_port": port, "beetle_metrics_addr": "127.0.0.1"}
    heir = eo_worker(
        pool="prefork",
        task_options=lease,
        extra_env={"BEETLE_TEST_CONF": json.dumps(conf), "BEETLE_TEST_SLOW": "0"},
    )
    assert wait_until(lambda: counts([heir])[1] == 1, timeout=30)
    starts = counts([doomed, heir], "start")[1]
    assert starts == 2
    assert wait_until(lambda: total(scrape(port), "beetle_task_completed_total") == 1, timeout=10)
    samples = scrape(port)
    assert total(samples, "beetle_lease_takeovers_total") == starts - 1
    assert total(samples, "beetle_leases_lost_total") == 0  # the loser died: it never knew
