"""``beetle fleet``: every consumer of every task queue on every broker, plain and older
beetle consumers flagged, exit 2 while any remains."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from kombu import Connection, Consumer, Queue

import kombu_beetle  # noqa: F401
from celery_beetle.cli import main
from celery_beetle.ops.fleet import classify, version_tuple
from celery_beetle.testing.waiting import wait_until

pytestmark = pytest.mark.integration


def _fleet(brokers, *extra):
    args = ["fleet", "--broker", brokers.beetle_url, *extra]
    for node in brokers.nodes:
        args += ["--management-url", f"{node.host_port}=http://{node.host}:{node.management_port}"]
    return CliRunner().invoke(main, args)


def _consuming(url, queue="jobs"):
    conn = Connection(url)
    channel = conn.channel()
    consumer = Consumer(channel, [Queue(queue, durable=True)], callbacks=[lambda b, m: None])
    consumer.consume()
    return conn


def test_a_plain_consumer_is_flagged_until_it_goes_and_then_fleet_exits_0(brokers):
    beetle = _consuming(brokers.beetle_url)
    plain = _consuming(brokers.nodes[0].amqp_url(brokers.vhost).replace("amqp://", "pyamqp://"))
    try:
        wait_until(lambda: _fleet(brokers).output.count("jobs") >= 4, timeout=15)
        result = _fleet(brokers, "--json")
        assert result.exit_code == 2, result.output
        rows = json.loads(result.output)
        kinds = sorted((r["kind"], r["broker"]) for r in rows if r["queue"] == "jobs")
        assert kinds == sorted(
            [("beetle", n.host_port) for n in brokers.nodes]
            + [("plain", brokers.nodes[0].host_port)]
        )
        plain.release()
        wait_until(lambda: _fleet(brokers).exit_code == 0, timeout=15)
        older = _fleet(brokers, "--min-version", "99.0")
        assert older.exit_code == 2
        assert "older than 99.0: 3" in older.output
    finally:
        beetle.release()
        plain.release()


def test_versions_compare_by_their_release_numbers():
    assert version_tuple("0.2.0.dev1") == (0, 2, 0)
    assert version_tuple("1.10") > version_tuple("1.9")
    assert classify({"product": "py-amqp", "version": "5.3"}, "0.1")[0] == "plain"
    assert classify({"product": "kombu-beetle", "beetle_version": "0.1.0"}, "0.2")[0] == "older"
    assert classify({"product": "kombu-beetle", "beetle_version": "0.2.0"}, "0.2")[0] == "beetle"
