"""Moved to :mod:`celery_beetle.testing.ports`: one implementation,
shared with the pytest plugin; this path stays for old imports."""

from __future__ import annotations

from celery_beetle.testing.ports import (
    free_port,
    log_tail,
    process_alive,
    wait_until_gone,
)

__all__ = [
    "free_port",
    "log_tail",
    "process_alive",
    "wait_until_gone",
]
