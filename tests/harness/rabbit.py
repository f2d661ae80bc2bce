"""Moved to :mod:`celery_beetle.testing.rabbit`: one implementation,
shared with the pytest plugin; this path stays for old imports."""

from __future__ import annotations

from celery_beetle.testing.rabbit import (
    RABBITMQ_BIN_DIR,
    BrokerSet,
    Message,
    RabbitNode,
    RabbitNodeError,
    beetle_url,
    rabbitmq_server_binary,
    start_all,
    stop_all,
)

__all__ = [
    "RABBITMQ_BIN_DIR",
    "BrokerSet",
    "Message",
    "RabbitNode",
    "RabbitNodeError",
    "beetle_url",
    "rabbitmq_server_binary",
    "start_all",
    "stop_all",
]
