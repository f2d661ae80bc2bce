"""celery_beetle: exactly-once execution of Celery tasks over kombu_beetle.

The worker side of the project: a Redis deduplication store, a consumer bootstep that gates
deliveries before the pool, and the opt-in ``BeetleTask`` base class::

    import celery_beetle
    from celery_beetle import BeetleTask

    app = Celery("shop", broker="beetle://guest:guest@rabbit1:5672,rabbit2:5672//")
    app.conf.beetle_redis_url = "redis://redis:6379/0"
    celery_beetle.install(app)

    @app.task(base=BeetleTask, attempts=3, exceptions=2, retry_delay=5)
    def charge(order_id): ...

Settings (``app.conf.beetle_*``): :mod:`celery_beetle.settings`. Task options:
``celery_beetle.task``. What the worker does with each delivery:
``celery_beetle.worker.gate``.

The package: the public surface at the top (this module's :func:`install`,
``celery_beetle.task``, :mod:`celery_beetle.settings`, ``celery_beetle.metrics``,
:mod:`celery_beetle.censor`) and a folder per wing, each ``__init__`` its map and its import
rules: ``celery_beetle.store`` (the dedup store and its rules), ``celery_beetle.worker``
(what runs inside a Celery worker), ``celery_beetle.ops`` (the operator's tools),
:mod:`celery_beetle.outbox`, ``celery_beetle.audit``, ``celery_beetle.cli`` (the
``beetle`` command), :mod:`celery_beetle.testing` (the pytest plugin's parts) and
``celery_beetle.contrib``. The store is at the bottom, then the settings and metrics,
the worker, the task and the operator's wings; :func:`install` assembles them
(``tests/unit/test_import_rules.py`` checks):

:May import: ``kombu_beetle``, ``celery_beetle._moved``, ``celery_beetle.settings``,
    ``celery_beetle.task``, ``celery_beetle.censor``, ``celery_beetle.worker``,
    ``celery_beetle.ops``, ``celery_beetle.versions``
"""

from __future__ import annotations

from typing import Any

from celery_beetle import _moved
from celery_beetle.settings import BeetleSettings, mask_url, parse_store_url
from celery_beetle.task import AttemptsExhausted, BeetleTask, DeadLettered

__all__ = [
    "AttemptsExhausted",
    "BeetleSettings",
    "BeetleTask",
    "DeadLettered",
    "install",
    "mask_url",
    "parse_store_url",
]

# the module paths of 0.1 that moved into the wings import until 0.2.0, with a warning
_moved.install()


def install(app: Any) -> Any:
    """Make ``app``'s workers deduplicate BeetleTasks; returns ``app``.

    Adds the gate bootstep to the worker's consumer (it reads and validates ``app.conf``'s
    ``beetle_*`` settings when the worker starts, so a mistake stops the worker before its
    first message) and the queue-policy step (``celery_beetle.ops.worker``, idle unless
    ``beetle_queue_policies`` is set) and the hand-back a queue migration asks for
    (``celery_beetle.ops.handback_control``), registers the ``beetle://`` transport,
    flushes trace events when a pool process exits, and makes Celery's reports (``celery report``,
    ``celery inspect conf``) censor the settings that can hold a credential
    (``beetle_redis_url``, ``beetle_outbox_db``, ``beetle_management``: :mod:`celery_beetle.censor`)
    like its own password settings.
    With ``beetle_trace_dir`` set (before this call) and a ``beetle://`` broker, publishers
    trace too (the transport's ``trace_dir`` option), so the audit sees both ends;
    ``beetle_dedup_scopes`` goes to the transport's ``dedup_scopes`` likewise, so that both
    ends name a message by the same scope. Calling it twice is harmless. A dependency older
    than beetle's floor (``celery_beetle.versions.FLOORS``) stops it with an error that
    names the package.
    """
    from celery.exceptions import ImproperlyConfigured
    from celery.signals import worker_process_shutdown

    from celery_beetle.versions import below_floor

    too_old = below_floor()
    if too_old:
        raise ImproperlyConfigured("celery_beetle: " + "; ".join(too_old))

    import kombu_beetle  # noqa: F401  (registers beetle://)
    from celery_beetle.censor import hide_secret_settings
    from celery_beetle.ops.handback_control import BeetleHandBackStep
    from celery_beetle.ops.worker import BeetlePolicyStep
    from celery_beetle.worker.bootstep import BeetleGateStep
    from celery_beetle.worker.quorum import leave_out_native_delayed_delivery

    hide_secret_settings()
    leave_out_native_delayed_delivery()
    if getattr(app, "_beetle_installed", False):
        return app
    app.steps["consumer"].add(BeetleGateStep)
    app.steps["consumer"].add(BeetlePolicyStep)
    app.steps["consumer"].add(BeetleHandBackStep)
    _configure_transport(app)
    worker_process_shutdown.connect(_flush_traces, weak=False)
    app._beetle_installed = True
    return app


def _configure_transport(app: Any) -> None:
    """Hand ``beetle_trace_dir`` and ``beetle_dedup_scopes`` to the transport (as
    ``trace_dir`` and ``dedup_scopes``), unless its own options set them."""
    broker_url = str(app.conf.get("broker_url") or "")
    if not broker_url.startswith("beetle://"):
        return
    given = {
        "trace_dir": app.conf.get("beetle_trace_dir"),
        "dedup_scopes": app.conf.get("beetle_dedup_scopes"),
    }
    given = {name: value for name, value in given.items() if value}
    if not given:
        return
    options = dict(app.conf.get("broker_transport_options") or {})
    for name, value in given.items():
        options.setdefault(name, value)
    app.conf.broker_transport_options = options


def _flush_traces(**kwargs: Any) -> None:
    from kombu_beetle.trace import flush_all

    flush_all()
