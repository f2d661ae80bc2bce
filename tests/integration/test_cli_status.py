"""``beetle status``: which broker is down, queue depths per broker, the dedup store."""

from __future__ import annotations

from click.testing import CliRunner
from kombu import Connection, Producer, Queue

from celery_beetle.cli import main


def status(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["status", *args], terminal_width=200)


def test_status_lists_every_broker_with_queue_depths_and_the_store(brokers, redis_url):
    with Connection(brokers.url_for(0)) as conn:
        Producer(conn.default_channel).publish("x", routing_key="work", declare=[Queue("work")])
    result = status("-b", brokers.beetle_url, "--redis", redis_url, "-Q", "work", "-Q", "absent")
    assert result.exit_code == 0, result.output
    for node in brokers.nodes:
        assert node.host_port in result.output
    assert "1/0" in result.output  # one ready message on the first broker, no consumer
    assert "dedup store" in result.output and "up" in result.output


def test_status_exits_1_and_names_the_broker_that_is_down(brokers):
    brokers.nodes[1].kill()
    result = status("-b", brokers.beetle_url)
    assert result.exit_code == 1
    line = next(x for x in result.output.splitlines() if brokers.nodes[1].host_port in x)
    assert "down" in line


def test_status_rejects_a_malformed_url_with_the_expected_form():
    result = status("-b", "beetle://h1:notaport//")
    assert result.exit_code == 2
    assert "expected beetle://USER:PASSWORD@HOST1:PORT1" in result.output
