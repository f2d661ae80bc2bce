"""Fixtures for the operations tests: management API clients for the test's brokers.

Tests here run on real RabbitMQ nodes (with the management plugin, on a port of their own)
and a real Redis, so they carry the ``integration`` marker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_beetle.ops.management import ManagementClient, ManagementConfig, clients_for_url

pytestmark = pytest.mark.integration


def management_config(brokers: Any, **kwargs: Any) -> ManagementConfig:
    """Where each test node's management API listens (each node has a port of its own)."""
    urls = {node.host_port: f"http://{node.host}:{node.management_port}" for node in brokers.nodes}
    return ManagementConfig(urls=urls, timeout_s=2.0, **kwargs)


@pytest.fixture
def management(brokers: Any) -> Callable[..., list[ManagementClient]]:
    """``management(*indexes)``: one client per node at ``indexes`` (all by default)."""

    def make(*indexes: int) -> list[ManagementClient]:
        return clients_for_url(brokers.url_for(*indexes), management_config(brokers))

    return make
