"""``beetle status --watch``: brokers, queue depths, the store and the workers' verdict rates."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from rich.console import Console

from celery_beetle.cli import main
from celery_beetle.cli.top import watch
from celery_beetle.testing.ports import free_port

prometheus_client = pytest.importorskip("prometheus_client")


@pytest.fixture
def worker_metrics():
    """A metrics endpoint shaped like a worker's, with a known dead letter."""
    registry = prometheus_client.CollectorRegistry()
    verdicts = prometheus_client.Counter(
        "beetle_gate_deliveries", "x", ["verdict"], registry=registry
    )
    dead = prometheus_client.Counter(
        "beetle_dead_letters", "x", ["queue", "reason"], registry=registry
    )
    verdicts.labels("run").inc(10)
    verdicts.labels("duplicate").inc(10)
    dead.labels("work", "attempts_limit").inc()
    port = free_port()
    server, _ = prometheus_client.start_http_server(port, "127.0.0.1", registry=registry)
    yield f"http://127.0.0.1:{port}/metrics", verdicts
    server.shutdown()


def test_watch_shows_brokers_queues_the_store_verdicts_and_dead_letters(
    brokers, redis_url, worker_metrics
):
    url, _ = worker_metrics
    console = Console(record=True, width=200, force_terminal=False)
    watch(
        brokers.beetle_url,
        redis_url,
        ["work"],
        [url, "http://127.0.0.1:1/metrics"],
        interval_s=0.1,
        refreshes=2,
        console=console,
    )
    text = console.export_text()
    for node in brokers.nodes:
        assert node.host_port in text
    assert "up" in text and "dedup store" in text
    assert "duplicate" in text and "run" in text
    assert "work" in text and "dead letters" in text
    assert "metrics unreachable: http://127.0.0.1:1/metrics" in text


def test_metrics_without_watch_is_a_usage_error(brokers):
    result = CliRunner().invoke(
        main, ["status", "-b", brokers.beetle_url, "--metrics", "http://x:1/metrics"]
    )
    assert result.exit_code == 2
    assert "--metrics goes with --watch" in result.output
