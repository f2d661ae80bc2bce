"""kombu_beetle: one kombu transport over N independent RabbitMQ brokers."""

from __future__ import annotations
