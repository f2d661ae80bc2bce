"""Real TLS to every broker and to Redis, with passwords that must show up nowhere.

Certificates are made by the test (:mod:`tests.harness.tls`); the servers listen on TLS
ports; a worker and a publisher run over them through a kill -9 of one broker, and every
log line, exception, CLI output and trace file of that run is searched for the password.
"""

from __future__ import annotations

import json
import logging

import pytest
import redis
from click.testing import CliRunner
from kombu import Connection

from celery_beetle.cli import main
from celery_beetle.store import address as store
from celery_beetle.testing.waiting import wait_until
from kombu_beetle.brokers import BrokerLink
from kombu_beetle.errors import BrokerTLSError, NoBrokerAvailable
from kombu_beetle.options import build_options
from tests.exactly_once.conftest import FAST, EoWorker, counts
from tests.harness.tls import TlsRabbitNode
from tests.security.conftest import SECRET

pytestmark = pytest.mark.integration


def _broker_url(nodes: list[TlsRabbitNode]) -> str:
    hosts = ",".join(f"127.0.0.1:{node.tls_port}" for node in nodes)
    return f"beetle://beetle:{SECRET}@{hosts}/?ssl=1"


def _redis_url(server, host: str = "localhost") -> str:
    return f"rediss://:{SECRET}@{host}:{server.tls_port}/0?ssl_ca_certs={server.ca}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory):
    """Where the TLS run leaves its trace, for the audit test after it."""
    return tmp_path_factory.mktemp("tls-run")


def test_worker_and_publisher_over_tls_survive_kill_9_of_a_broker_and_leak_no_password(
    tls_nodes, tls_redis, certs, tmp_path, run_dir, caplog
):
    from tests.exactly_once.app import make_app

    caplog.set_level(logging.DEBUG)
    url, redis_url = _broker_url(tls_nodes), _redis_url(tls_redis)
    options = {**FAST, "ssl": {"ca_certs": str(certs.ca)}}
    trace_dir = run_dir / "trace"
    worker = EoWorker(
        url,
        redis_url,
        tmp_path / "w.out",
        trace_dir=str(trace_dir),
        extra_env={"BEETLE_TEST_OPTIONS": json.dumps(options)},
    ).start()
    app = make_app(url, redis_url, transport_options=options, trace_dir=str(trace_dir))
    try:
        for item in range(10):
            app.tasks["eo.record"].delay(item)
        assert wait_until(lambda: len(counts([worker])) == 10, timeout=20), worker.log_text()
        tls_nodes[0].kill()
        for item in range(10, 20):
            app.tasks["eo.record"].delay(item)
        assert wait_until(lambda: len(counts([worker])) == 20, timeout=20), worker.log_text()
        assert counts([worker]) == dict.fromkeys(range(20), 1)
        # beetle status has no transport options: the CA comes the way OpenSSL's defaults do
        env = {"BEETLE_BROKER_URL": url, "BEETLE_REDIS_URL": redis_url}
        status = CliRunner().invoke(
            main, ["status"], env={**env, "SSL_CERT_FILE": str(certs.ca), "COLUMNS": "300"}
        )
        report = app.conf.humanize(with_defaults=False, censored=True)
    finally:
        app.close()
        worker.kill()
        tls_nodes[0].start()

    assert status.exit_code == 1, status.output  # the killed broker was down when it ran
    up_line = next(
        line for line in status.output.splitlines() if str(tls_nodes[1].tls_port) in line
    )
    assert "up" in up_line, status.output
    assert "dedup store rediss://:***@localhost" in status.output
    traces = [path.read_text() for path in trace_dir.glob("*.jsonl")]
    assert traces and all(oct(p.stat().st_mode)[-3:] == "600" for p in trace_dir.glob("*"))
    outputs = {
        "worker log": worker.log_text(),
        "worker output": (tmp_path / "w.out").read_text(),
        "publisher log": caplog.text,
        "exceptions": " ".join(str(r.exc_info[1]) for r in caplog.records if r.exc_info),
        "beetle status": status.output,
        "celery report": report,
        "traces": "".join(traces),
    }
    assert "is down" in caplog.text or "down" in worker.log_text()
    leaked = [what for what, text in outputs.items() if SECRET in "".join(text.split())]
    assert not leaked, f"the password is in: {leaked}"


@pytest.mark.spark
def test_the_audit_of_that_run_is_clean_and_holds_no_password(spark, run_dir):
    from celery_beetle.audit import job

    if not list((run_dir / "trace").glob("*.jsonl")):
        pytest.skip("the TLS run left no trace (it failed or was deselected)")
    result = job.run_audit(spark, str(run_dir / "trace"), str(run_dir / "audit"))
    assert result.ok and result.summary["completed_once"] == 20, result.summary
    for name in ("summary.json", "report.html"):
        assert SECRET not in (run_dir / "audit" / name).read_text(), name


def test_a_broker_whose_certificate_names_another_host_is_refused_naming_it(certs, tmp_path):
    from tests.conftest import _start_timeout

    node = TlsRabbitNode(tmp_path / "wrong", certs.ca, certs.wrong, SECRET, management=False)
    node.start(timeout=_start_timeout())
    try:
        url = f"beetle://beetle:{SECRET}@127.0.0.1:{node.tls_port}/?ssl=1"
        options = build_options(url, {"ssl": {"ca_certs": str(certs.ca)}, "connect_timeout": 3})
        with pytest.raises(BrokerTLSError) as caught:
            BrokerLink(options.brokers[0], options).connect()
        message = str(caught.value)
        assert message.startswith(
            f"TLS to broker 127.0.0.1:{node.tls_port} failed: IP address mismatch, "
            "certificate is not valid for '127.0.0.1'. Check that"
        )
        conn = Connection(url, transport_options={"ssl": {"ca_certs": str(certs.ca)}, **FAST})
        with pytest.raises(NoBrokerAvailable, match=f"127.0.0.1:{node.tls_port}: BrokerTLSError"):
            conn.connect()
        assert SECRET not in message
        # the same broker named as the certificate says is accepted
        renamed = build_options(
            url,
            {
                "ssl": {"ca_certs": str(certs.ca)},
                "broker_options": {
                    f"127.0.0.1:{node.tls_port}": {
                        "ssl": {"ca_certs": str(certs.ca), "server_hostname": "wrong.example"}
                    }
                },
            },
        )
        BrokerLink(renamed.brokers[0], renamed).connect().close()
    finally:
        node.kill()


def test_redis_over_tls_verifies_certificate_and_host_name(tls_redis, wrong_redis):
    assert store.connect(_redis_url(tls_redis)).ping()
    assert store.connect(_redis_url(tls_redis, host="127.0.0.1")).ping()
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        store.connect(_redis_url(wrong_redis)).ping()
    unverified = _redis_url(wrong_redis) + "&ssl_check_hostname=false"
    assert store.connect(unverified).ping()
    no_ca = f"rediss://:{SECRET}@localhost:{tls_redis.tls_port}/0"
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        store.connect(no_ca).ping()


def test_the_management_api_over_tls_is_verified_against_the_given_ca(tls_nodes, certs):
    from celery_beetle.ops.management import (
        ManagementConfig,
        ManagementUnreachable,
        clients_for_url,
    )

    node = tls_nodes[1]
    url = _broker_url([node])
    trusted = ManagementConfig(scheme="https", port=node.management_tls_port, verify=str(certs.ca))
    (client,) = clients_for_url(url, trusted)
    assert client.overview()
    assert isinstance(client.policies(), list)
    untrusted = ManagementConfig(scheme="https", port=node.management_tls_port)
    (client,) = clients_for_url(url, untrusted)
    with pytest.raises(ManagementUnreachable, match=r"(?i)certificate verify failed"):
        client.overview()
    assert SECRET not in repr(trusted) and SECRET not in repr(client)
