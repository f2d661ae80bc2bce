"""Moved to :mod:`celery_beetle.testing.proxy` (the fault explorer needs it too); this path
stays for the tests' imports."""

from __future__ import annotations

from celery_beetle.testing.proxy import TcpProxy

__all__ = ["TcpProxy"]
