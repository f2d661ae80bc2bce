"""Moved to :mod:`celery_beetle.testing.redis_server`: one implementation,
shared with the pytest plugin; this path stays for old imports."""

from __future__ import annotations

from celery_beetle.testing.redis_server import (
    RedisServer,
    RedisServerError,
    redis_server_binary,
)

__all__ = [
    "RedisServer",
    "RedisServerError",
    "redis_server_binary",
]
