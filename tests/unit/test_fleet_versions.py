"""``beetle fleet`` names each consumer's client and version from its AMQP client properties."""

from __future__ import annotations

import amqp
from amqp.connection import LIBRARY_PROPERTIES

from celery_beetle.ops.fleet import classify
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
