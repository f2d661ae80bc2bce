"""Moved to :mod:`celery_beetle.testing.sentinel`: one implementation, shared with the fault
explorer; this path stays for old imports."""

from __future__ import annotations

from celery_beetle.testing.sentinel import SentinelProcess, SentinelSet

__all__ = ["SentinelProcess", "SentinelSet"]
