"""The relay inside a worker: a bootstep running :class:`~.relay.Relay` on a thread.

``celery_beetle.outbox.install_relay(app)`` adds it; it relays while the worker runs when
``beetle_outbox_db`` is set (a database URL), and stops with the worker;
``beetle_outbox_listen = True`` makes it wake on NOTIFY (:mod:`.notify`). Several workers
relaying side by side take disjoint rows (``SKIP LOCKED``). A separate ``beetle relay``
process is the better choice when workers restart often or scale to zero.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps

__all__ = ["OutboxRelayStep", "install_relay"]

logger = logging.getLogger(__name__)


class OutboxRelayStep(bootsteps.StartStopStep):
    """Runs a relay thread in the worker's main process."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self.thread: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.url = worker.app.conf.get("beetle_outbox_db")

    def include_if(self, worker: Any) -> bool:
        return bool(self.url)

    def start(self, worker: Any) -> None:
        self.stop_event.clear()
        self.thread = threading.Thread(
            target=self._run, args=(worker.app,), name="beetle-relay", daemon=True
        )
        self.thread.start()

    def _run(self, app: Any) -> None:
        from celery_beetle.outbox.db import engine_for
        from celery_beetle.outbox.relay import Relay

        engine = engine_for(self.url)
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=None)
            listen = bool(app.conf.get("beetle_outbox_listen"))
            relay = Relay(engine, conn.channel(), listen=listen)
            logger.info("beetle relay: relaying the outbox in this worker")
            relay.run(self.stop_event)
        engine.dispose()

    def stop(self, worker: Any) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(10)


def install_relay(app: Any) -> Any:
    """Relay the outbox (``beetle_outbox_db``) inside this app's workers; returns ``app``.

    Celery's reports censor ``beetle_outbox_db`` from then on, even in an app that never
    calls :func:`celery_beetle.install`."""
    from celery_beetle.censor import hide_secret_settings

    hide_secret_settings()
    app.steps["worker"].add(OutboxRelayStep)
    return app
