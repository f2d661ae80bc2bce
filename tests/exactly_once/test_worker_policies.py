"""A worker keeps its queues' policies applied (:mod:`celery_beetle.ops.worker`)."""

from __future__ import annotations

import json

import pytest

from celery_beetle.ops.management import clients_for_url
from celery_beetle.testing.waiting import wait_until
from tests.ops.conftest import management_config

pytestmark = pytest.mark.integration


def test_a_worker_applies_the_policies_of_its_queues_in_the_background(brokers, eo_worker):
    config = management_config(brokers)
    conf = {
        "beetle_queue_policies": {"default": {"max_length": 500}},
        "beetle_management": {"urls": dict(config.urls), "timeout_s": 2},
        "beetle_policy_interval": 0.5,
    }
    eo_worker(extra_env={"BEETLE_TEST_CONF": json.dumps(conf)})
    for client in clients_for_url(brokers.beetle_url, config):
        assert wait_until(lambda c=client: c.queue("celery.dead") is not None, 15)
        (policy,) = client.policies()
        assert policy["name"] == "beetle.celery"
        assert policy["definition"]["max-length"] == 500
