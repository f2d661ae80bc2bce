"""Opt-in LISTEN/NOTIFY wake-ups for the relay.

Polling is the default: the relay's adaptive poll costs an idle database one cheap query
per ``max_interval_s`` and nothing on the enqueue side. With ``beetle_outbox_notify = True``
each enqueue also runs ``pg_notify('beetle_outbox', '')`` in its transaction, and a relay
started with ``listen=True`` (``beetle relay --listen``) waits on ``LISTEN beetle_outbox``
between passes instead of sleeping, so a commit wakes it at once.

The price is in PostgreSQL: a transaction that sent a notification takes a database-wide
lock at commit to queue it, so committing enqueuers are serialized at that point;
transaction-pooling PgBouncer does not carry LISTEN. ``benchmarks/bench_outbox.py`` prints
what it costs and buys here. A notification only wakes the relay; the poll stays the
safety net (a notification lost with a broken connection delays a row by one interval).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import sqlalchemy as sa

__all__ = ["CHANNEL", "Listener", "notify"]

logger = logging.getLogger(__name__)

CHANNEL = "beetle_outbox"
#: a wait on the LISTEN connection looks at the stop event this often
STOP_CHECK_S = 0.5


def notify(session: Any) -> None:
    """Queue the wake-up in ``session``'s transaction (sent by PostgreSQL at commit, and
    never for a rollback; repeats within one transaction are folded into one)."""
    session.execute(sa.text("SELECT pg_notify(:channel, '')"), {"channel": CHANNEL})


class Listener:
    """A connection of its own that LISTENs; :meth:`wait` returns early on a notification.

    It reconnects on the next wait after an error; meanwhile waits just sleep.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._conn: Any = None

    def _connect(self) -> Any:
        import psycopg

        conn = psycopg.connect(self.url, autocommit=True)
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` seconds for a notification (True if one came), in slices
        so that ``stop`` ends it soon; without a connection, sleep on ``stop``."""
        deadline = time.monotonic() + timeout
        try:
            if self._conn is None:
                self._conn = self._connect()
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                woken = False
                for _ in self._conn.notifies(timeout=min(left, STOP_CHECK_S), stop_after=1):
                    woken = True
                if woken:  # several commits, one pass: drain what else arrived (not nested:
                    # a generator holds the connection's lock until it ends)
                    for _ in self._conn.notifies(timeout=0):
                        pass
                    return True
            return False
        except Exception as exc:
            logger.warning("beetle relay: LISTEN connection failed, polling: %s", exc)
            self.close()
            stop.wait(max(0.0, deadline - time.monotonic()))
            return False

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None
