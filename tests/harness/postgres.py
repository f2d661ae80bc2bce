"""Moved to :mod:`celery_beetle.testing.postgres` (the fault explorer needs it too); this path
stays for the tests' imports."""

from __future__ import annotations

from celery_beetle.testing.postgres import PostgresServer, PostgresServerError, postgres_bin_dir

__all__ = ["PostgresServer", "PostgresServerError", "postgres_bin_dir"]
