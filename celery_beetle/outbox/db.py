"""The database URL of the outbox: ``postgresql://`` means psycopg 3 here."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

__all__ = ["engine_for", "normalize_url"]


def normalize_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` become ``postgresql+psycopg://`` (SQLAlchemy's
    default driver for them is psycopg2, which the ``outbox`` extra does not install)."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url


def engine_for(url: str, **options: Any) -> sa.Engine:
    """An engine for the outbox's database; a bad URL raises ValueError with the form."""
    try:
        return sa.create_engine(normalize_url(url), pool_pre_ping=True, **options)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
        raise ValueError(
            f"bad outbox database URL: {exc}; expected e.g. "
            "postgresql://user:password@host:5432/dbname"
        ) from None
