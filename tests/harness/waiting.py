"""Moved to :mod:`celery_beetle.testing.waiting`: one implementation,
shared with the pytest plugin; this path stays for old imports."""

from __future__ import annotations

from celery_beetle.testing.waiting import (
    wait_until,
)

__all__ = [
    "wait_until",
]
