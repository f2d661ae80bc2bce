"""Moved to :mod:`celery_beetle.testing.redis_faults`: one implementation,
shared with the pytest plugin; this path stays for old imports."""

from __future__ import annotations

from celery_beetle.testing.redis_faults import (
    refusing_writes,
)

__all__ = [
    "refusing_writes",
]
