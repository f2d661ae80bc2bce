"""The Grafana dashboard's PromQL against a real Prometheus that scraped a real run.

A prefork worker (metrics on) and this process's publisher (``start_http_server``) are scraped
every second by Debian's ``prometheus`` while messages flow, one broker's traffic is cut and
Redis is killed and restarted; then every panel of examples/grafana-dashboard.json is asked
of that Prometheus, and must answer without an error and, but for the outbox's, with data.
``BEETLE_DASHBOARD_PNG=docs/dashboard.png`` also draws the panels there (the README's picture).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from celery_beetle.testing.ports import free_port
from celery_beetle.testing.rabbit import beetle_url
from celery_beetle.testing.servers import server_missing
from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts
from tests.prometheus import panels

prometheus_client = pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.integration

OPTIONS = {"attempts": 3, "exceptions": 2, "retry_delay": 0.2, "max_delay": 1, "timeout": 5}
#: panels a run without an outbox leaves empty
MAY_BE_EMPTY = {"Outbox: pending rows / oldest age"}


@pytest.fixture
def prometheus(tmp_path: Path):
    binary = shutil.which("prometheus")
    if binary is None:
        server_missing("prometheus (Debian's prometheus package)")
    assert binary is not None
    port = free_port()
    targets: dict[str, str] = {}

    def start(jobs: dict[str, str]) -> str:
        targets.update(jobs)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(panels.DASHBOARD.parent / "prometheus-alerts.yml")],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in jobs.items()
            ],
        }
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))
        log = (tmp_path / "prometheus.log").open("w")  # closed at teardown
        logs.append(log)
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: _ready(url), timeout=30), (
            tmp_path / "prometheus.log"
        ).read_text()
        return url

    started: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []
    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=10)
    for log in logs:
        log.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False


def test_every_dashboard_panel_answers_from_a_real_prometheus_after_broker_and_redis_faults(
    brokers, redis_aof, client, eo_worker, tcp_proxy, prometheus, tmp_path
):
    proxy = tcp_proxy(brokers.nodes[2])
    url = beetle_url(
        [brokers.nodes[0].host_port, brokers.nodes[1].host_port, proxy.host_port], brokers.vhost
    )
    worker_port, publisher_port = free_port(), free_port()
    conf = {"beetle_metrics_port": worker_port, "beetle_metrics_addr": "127.0.0.1"}
    worker = eo_worker(
        url=url,
        redis=redis_aof.url,
        pool="prefork",
        concurrency=2,
        task_options=OPTIONS,
        extra_env={"BEETLE_TEST_CONF": json.dumps(conf)},
    )
    server, _ = prometheus_client.start_http_server(publisher_port, "127.0.0.1")
    try:
        prom = prometheus(
            {
                "beetle-worker": f"127.0.0.1:{worker_port}",
                "beetle-publisher": f"127.0.0.1:{publisher_port}",
            }
        )
        app = client(url=url, task_options=OPTIONS)
        started = time.time()
        items: list[int] = []

        def publish() -> None:
            for item in range(400):
                if item % 40 == 0:
                    app.tasks["eo.flaky"].delay(10_000 + item)
                app.tasks["eo.record"].delay(item, 0.05)
                items.append(item)
                time.sleep(0.06)

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        time.sleep(6)
        proxy.cut()
        time.sleep(5)
        proxy.restore()
        time.sleep(4)
        redis_aof.kill()
        time.sleep(4)
        redis_aof.start()
        publisher.join(60)
        assert wait_until(lambda: set(counts([worker])) >= set(items), timeout=60)
        time.sleep(4)  # the last scrapes
        answered = panels.ask(prom, started, time.time())
    finally:
        server.shutdown()

    errors = [e for p in answered for e in p.errors]
    assert errors == []
    empty = {p.title for p in answered if not p.series}
    assert empty <= MAY_BE_EMPTY
    by_title = {p.title: p for p in answered}
    up = by_title["Brokers up (1) / down (0)"]
    cut = [s for s in up.series if s.legend == proxy.host_port]
    assert cut and min(cut[0].values) == 0 and cut[0].values[-1] == 1, "the cut is visible"
    store = by_title["Dedup store up / unavailable time"]
    assert any(s.legend.startswith("up") and min(s.values) == 0 for s in store.series)
    out = Path(os.environ.get("BEETLE_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    main = [p for p in answered if p.title not in MAY_BE_EMPTY][:12]
    panels.render(
        main,
        out,
        title="beetle: a broker's traffic cut at 6 s for 5 s, Redis killed at 15 s for 4 s",
    )
    assert out.stat().st_size > 10_000
