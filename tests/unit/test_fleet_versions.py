"""``beetle fleet`` names each consumer's client and version from its AMQP client properties."""

from __future__ import annotations

import amqp
from amqp.connection import LIBRARY_PROPERTIES

from celery_beetle.ops.fleet import classify, survey
from kombu_beetle.identity import client_properties, package_version


def test_a_plain_py_amqp_consumer_shows_the_version_it_sends_as_product_version():
    # what a plain Celery worker's connection announces (py-amqp sends no "version")
    properties = {**LIBRARY_PROPERTIES, "capabilities": {}}
    assert classify(properties, "0.1") == ("plain", "py-amqp", amqp.__version__)


def test_a_client_sending_version_shows_it():
    properties = {"product": "pika", "version": "1.3.2", "product_version": "ignored"}
    assert classify(properties, "0.1") == ("plain", "pika", "1.3.2")


def test_a_beetle_consumer_shows_the_beetle_version_not_py_amqps():
    properties = {**LIBRARY_PROPERTIES, **client_properties()}
    assert classify(properties, "0") == ("beetle", "kombu-beetle", package_version())


class _Api:
    """A management API whose connections list catches up with its consumers after
    ``lag`` reads, as the broker's statistics do."""

    name = "rabbit1:5672"

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.reads = 0

    def consumers(self) -> list[dict]:
        self.reads += 1
        return [{"queue": {"name": "celery"}, "channel_details": {"connection_name": "c1"}}]

    def connections(self) -> list[dict]:
        if self.reads <= self.lag:
            return []
        return [{"name": "c1", "client_properties": client_properties()}]


def test_a_consumer_listed_before_its_connection_is_read_again_until_the_api_catches_up():
    api = _Api(lag=2)
    waits: list[float] = []
    report = survey([api], ["celery"], "0", sleep=waits.append)  # type: ignore[list-item]
    assert [c.kind for c in report.consumers] == ["beetle"]
    assert waits == [1.0, 1.0] and report.ok


def test_a_consumer_whose_connection_never_shows_is_flagged_unknown_after_the_wait():
    api = _Api(lag=100)
    waits: list[float] = []
    report = survey([api], ["celery"], "0", settle_s=3, sleep=waits.append)  # type: ignore[list-item]
    assert [(c.kind, c.product) for c in report.consumers] == [("unknown", "unknown")]
    assert len(waits) == 3 and not report.ok
