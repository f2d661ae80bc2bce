"""The user's Celery app, pointed at a test's brokers, dedup store and trace directory.

The same :func:`configure` runs in the test process (the app the test publishes with) and in
the worker subprocess (:mod:`.worker_app`, which reads its arguments from the environment),
so both ends name the same brokers, store and trace; ``celery_beetle.install`` is applied
after the settings, so the transport traces the publishes too.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.app.utils import find_app

import celery_beetle

__all__ = [
    "FAST",
    "configure",
    "drop_connections",
    "load_app",
    "missing_app_root",
    "restore",
    "worker_env",
]

#: short transport timeouts, so that a fault is noticed and healed within seconds
FAST: dict[str, Any] = {
    "confirm_timeout": 1.0,
    "reconnect_interval": 0.2,
    "reconnect_max_interval": 1.0,
    "connect_timeout": 1.0,
}

_ENV_PREFIX = "BEETLE_PYTEST_"


def load_app(path: str) -> Celery:
    """The app at ``path``: ``package.module:attribute``, or a module holding ``app``/``celery``
    (what ``celery -A`` accepts)."""
    if not path:
        raise ValueError(
            "no Celery app for the beetle worker: set `beetle_app = package.module:app` in the "
            "[pytest] ini section, or override the `beetle_app_path` fixture"
        )
    app = find_app(path)
    if not isinstance(app, Celery):
        raise TypeError(f"{path!r} is {app!r}, not a Celery app")
    return app


def missing_app_root(path: str, root: Path) -> Path | None:
    """``root`` when the app's top-level package (``path``: ``package.module:attribute``) is
    not importable as things stand but sits in ``root``; else None (nothing to add).

    pytest puts the test files' directories on ``sys.path``, not the project's, so
    ``beetle_app = shop.tasks:app`` beside ``shop/`` needed ``pythonpath = .`` in the ini.
    """
    top = path.partition(":")[0].split(".")[0].strip()
    if not top.isidentifier():
        return None
    if importlib.util.find_spec(top) is not None:  # installed, or on the path already
        return None
    if (root / top).is_dir() or (root / f"{top}.py").is_file():
        return root
    return None


def configure(
    app: Celery,
    *,
    broker_url: str,
    redis_url: str,
    trace_dir: str | os.PathLike[str],
    transport_options: dict[str, Any] | None = None,
    conf: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Point ``app`` at the test's servers and trace, install the gate; return the settings
    it had, for :func:`restore`."""
    options = {
        **dict(app.conf.get("broker_transport_options") or {}),
        **FAST,
        **(transport_options or {}),
        "trace_dir": str(trace_dir),  # the transport traces the publishes
    }
    settings = {
        "broker_url": broker_url,
        "broker_transport_options": options,
        "broker_connection_retry_on_startup": True,
        "beetle_redis_url": redis_url,
        "beetle_trace_dir": str(trace_dir),
        "result_backend": None,  # a BeetleTask needs none; `conf` may set one
        **(conf or {}),
    }
    previous = {key: app.conf.get(key) for key in settings}
    drop_connections(app)  # an earlier test's brokers (and vhost) are gone
    app.conf.update(settings)
    celery_beetle.install(app)
    return previous


def restore(app: Celery, previous: dict[str, Any]) -> None:
    """Close the app's connections and give it back the settings :func:`configure` replaced."""
    drop_connections(app)
    app.conf.update(previous)


def drop_connections(app: Celery) -> None:
    """Close and forget the app's connection and producer pools, so the next publish
    connects to the brokers ``app.conf`` names now. (``app.close()`` forgets the connection
    pool only: the producer pool would keep publishing on the old connections.)"""
    pool = app._pool
    if pool is not None:
        pool.force_close_all()
        app._pool = None
    amqp = app.__dict__.get("amqp")  # a cached property: present once used
    if amqp is not None and amqp._producer_pool is not None:
        amqp._producer_pool.force_close_all()
        amqp._producer_pool = None


def worker_env(
    app_path: str,
    *,
    broker_url: str,
    redis_url: str,
    trace_dir: str | os.PathLike[str],
    transport_options: dict[str, Any] | None = None,
    conf: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The environment that makes :mod:`.worker_app` load and configure ``app_path``."""
    return {
        f"{_ENV_PREFIX}APP": app_path,
        f"{_ENV_PREFIX}BROKER_URL": broker_url,
        f"{_ENV_PREFIX}REDIS_URL": redis_url,
        f"{_ENV_PREFIX}TRACE_DIR": str(Path(trace_dir)),
        f"{_ENV_PREFIX}TRANSPORT_OPTIONS": json.dumps(transport_options or {}),
        f"{_ENV_PREFIX}CONF": json.dumps(conf or {}),
    }


def app_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> Celery:
    """The app :func:`worker_env` described, configured (in the worker subprocess)."""
    try:
        path = env[f"{_ENV_PREFIX}APP"]
    except KeyError:
        raise RuntimeError(
            "celery_beetle.testing.worker_app is started by the beetle pytest plugin, "
            f"which sets {_ENV_PREFIX}APP and the other {_ENV_PREFIX}* variables"
        ) from None
    app = load_app(path)
    configure(
        app,
        broker_url=env[f"{_ENV_PREFIX}BROKER_URL"],
        redis_url=env[f"{_ENV_PREFIX}REDIS_URL"],
        trace_dir=env[f"{_ENV_PREFIX}TRACE_DIR"],
        transport_options=json.loads(env.get(f"{_ENV_PREFIX}TRANSPORT_OPTIONS") or "{}"),
        conf=json.loads(env.get(f"{_ENV_PREFIX}CONF") or "{}"),
    )
    return app
