"""The fixtures a conftest beside Celery's ``t/integration`` imports.

Written as ``t/conftest.py`` (:data:`CONFTEST`), one directory above the suite's own
conftest, so they override ``celery.contrib.pytest``'s and leave the suite's untouched. With
``BEETLE_CONFORMANCE_STORE`` set (a Redis URL for the dedup store), every task of the
session app and of each test's app is a BeetleTask and both apps are ``install``-ed;
without it they are plain Celery, so one tree runs under both transports.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = [
    "CONFTEST",
    "STORE_ENV",
    "beetle_function_app",
    "beetle_session_app",
    "celery_parameters",
]

#: the dedup store's URL; unset: plain Celery
STORE_ENV = "BEETLE_CONFORMANCE_STORE"

CONFTEST = (
    '"""Every task a BeetleTask: see celery_beetle.testing.conformance.overrides."""\n'
    "from celery_beetle.testing.conformance.overrides import *  # noqa: F403\n"
)


def _store_url() -> str | None:
    return os.environ.get(STORE_ENV) or None


def _install(app: Any) -> None:
    import celery_beetle

    app.conf.beetle_redis_url = _store_url()
    celery_beetle.install(app)


@pytest.fixture(scope="session")
def celery_parameters() -> dict[str, Any]:
    """The parameters of every app the suite makes: ``task_cls`` is BeetleTask."""
    if _store_url() is None:
        return {}
    from celery_beetle import BeetleTask

    return {"task_cls": BeetleTask}


@pytest.fixture(scope="session", autouse=True)
def beetle_session_app(celery_session_app: Any) -> Iterator[None]:
    """The session app (its worker runs the suite's tasks) installed before the worker starts."""
    if _store_url() is not None:
        _install(celery_session_app)
    yield


@pytest.fixture(autouse=True)
def beetle_function_app(celery_app: Any) -> Iterator[None]:
    """Each test's own app (it publishes and reads results) installed likewise."""
    if _store_url() is not None:
        _install(celery_app)
    yield
