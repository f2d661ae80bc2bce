"""Each broker's loss and return is said once per process, whatever connection notices."""

from __future__ import annotations

import logging

from kombu_beetle.broker_log import BrokerLog


def _said(caplog, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_two_connections_losing_a_broker_say_it_once_and_its_return_once(caplog):
    now = [0.0]
    log = BrokerLog(clock=lambda: now[0])
    consumer = log.up("h1:5672")
    producer = log.up("h1:5672")
    with caplog.at_level(logging.DEBUG, logger="kombu_beetle.brokers"):
        assert log.down("h1:5672", ConnectionResetError(), consumer)
        assert not log.down("h1:5672", ConnectionResetError(), producer)
        assert not log.down("h1:5672", ConnectionRefusedError())  # a fresh connect fails
        now[0] = 12.34
        log.up("h1:5672")
        log.up("h1:5672")
    assert _said(caplog) == [
        "beetle: broker h1:5672 is down: ConnectionResetError()",
        "beetle: broker h1:5672 is up again after 12.3 s",
    ]


def test_a_connection_made_before_an_outage_noticing_it_late_is_not_a_new_outage(caplog):
    log = BrokerLog()
    idle_producer = log.up("h1:5672")
    consumer = log.up("h1:5672")
    with caplog.at_level(logging.DEBUG, logger="kombu_beetle.brokers"):
        log.down("h1:5672", ConnectionResetError(), consumer)
        log.up("h1:5672")  # the consumer reconnects; the producer was idle throughout
        assert not log.down("h1:5672", BrokenPipeError(), idle_producer)
        assert log.down("h2:5672", BrokenPipeError(), 0)  # another broker is its own news
    assert [m.split(":")[1] for m in _said(caplog)] == [" broker h1", " broker h1", " broker h2"]
