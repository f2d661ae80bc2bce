"""Moved to :mod:`celery_beetle.testing.containers`: one implementation,
shared with the pytest plugin; this path stays for old imports."""

from __future__ import annotations

from celery_beetle.testing.containers import (
    LABEL,
    RABBITMQ_IMAGE,
    REDIS_IMAGE,
    RabbitContainer,
    RedisContainer,
    docker_engine,
    missing_images,
    prepare_engine,
)

__all__ = [
    "LABEL",
    "RABBITMQ_IMAGE",
    "REDIS_IMAGE",
    "RabbitContainer",
    "RedisContainer",
    "docker_engine",
    "missing_images",
    "prepare_engine",
]
