"""The inbox: a body's database effects committed once, even when its run is repeated.

The dedup store runs a body once unless its worker dies after the body's effects and
before the completion is stored: then the lease runs out and a later attempt runs the body
again. When the effects are writes to a database, the hole closes where sqlxmq closes it:
the message is marked done *in the same transaction* as its effects.

.. code-block:: python

    from celery_beetle.outbox import inbox

    @app.task(base=BeetleTask, bind=True)
    def charge(self, order_id):
        with Session(engine) as session, session.begin():
            if not inbox.once(session, self.request):
                return  # an earlier run committed this already
            session.add(Charge(order_id=order_id))

:func:`once` inserts ``(scope, message id, step)`` into ``beetle_inbox`` with ``ON CONFLICT
DO NOTHING`` and says whether this run inserted it. The row commits or rolls back with the
effects, so:

- the first run to commit wins; a run after it (the same message after a crash between
  that commit and the Redis completion) finds the row, returns, and its run is completed in
  the dedup store as any successful run is;
- a run that raised rolled its row back with its effects: a retry does the work;
- two runs at once (a lease that ran out under a run that was not dead) cannot both
  commit: the second insert waits for the first transaction on the primary key, then finds
  the row.

Why a call in the body rather than a task option: the transaction stays the caller's (as
with :func:`celery_beetle.outbox.delay`). A task option would have to open the session
for the body and commit it after, hiding the commit point, and a body often does other
things around its transaction (an HTTP call, a second transaction with a ``step``).

``step`` names one of several transactions in one body (each is marked on its own). The
skipped run's return value is None: keep in the database what later steps need.

Rows live until the message's dedup window ends (``expires_at``: after it no copy of the
message runs at all); :func:`sweep` deletes the expired ones in small batches. The relay
sweeps once a minute when the table exists; without a relay, run ``beetle outbox sweep``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from celery_beetle.outbox.table import INBOX

__all__ = ["InboxError", "inbox_row", "once", "sweep"]

logger = logging.getLogger(__name__)


class InboxError(ValueError):
    """``once`` was called without a running BeetleTask's request, or with a bad step."""


def once(session: Any, request: Any, *, step: str = "", app: Any = None) -> bool:
    """Mark the running message done in ``session``'s transaction; True when this run is
    the first to do so (go on with the effects), False when a run committed it before.

    ``request`` is the task's ``self.request`` (``bind=True``). Outside a worker (called
    directly, eagerly) there is no message to mark: it returns True. ``app``: the Celery
    app whose settings define the dedup identity (default: the current app, the worker's).
    """
    row = inbox_row(request, step, app)
    if row is None:
        return True
    committing(request)
    bind = session.get_bind() if hasattr(session, "get_bind") else session
    insert: sa.Insert
    if bind.dialect.name == "postgresql":
        insert = postgresql.insert(INBOX).values(row).on_conflict_do_nothing()
    else:  # SQLite: the same with INSERT OR IGNORE
        insert = sa.insert(INBOX).values(row).prefix_with("OR IGNORE", dialect="sqlite")
    # RETURNING, not rowcount: drivers report -1 for an insert that did nothing
    inserted = session.execute(insert.returning(INBOX.c.message_id)).first() is not None
    if not inserted:
        skipped(row)
    return inserted


def inbox_row(request: Any, step: str = "", app: Any = None) -> dict[str, Any] | None:
    """The ``beetle_inbox`` row of the running message; None outside a worker."""
    if getattr(request, "called_directly", True) or getattr(request, "is_eager", False):
        return None
    if not isinstance(step, str) or len(step) > 64:
        raise InboxError(f"step must be text of at most 64 characters, got {step!r}")
    scope, message_id, expires_at = _identity(request, app)
    return {
        "scope": scope,
        "message_id": message_id,
        "step": step,
        "task_name": str(getattr(request, "task", None) or "")[:255],
        "created_at": dt.datetime.now(dt.timezone.utc),
        "expires_at": expires_at,
    }


def committing(request: Any) -> None:
    """Note in the dedup store that this run commits its effects through the inbox: if its
    worker dies right after the commit, the message gets another start (even past
    ``attempts``, the default 1), which finds the row and returns, instead of a dead letter
    for effects that are committed (:func:`celery_beetle.worker.run_state.mark_inbox`)."""
    from celery_beetle.worker.run_state import mark_inbox

    mark_inbox(request)


def skipped(row: dict[str, Any]) -> None:
    """Log a run that found its message's effects committed. (The trace shows it as
    started and completed, the earlier run as started only: the audit's view of a crash.)"""
    logger.info("beetle inbox: %s (%s) committed by an earlier run; skipping its effects",
                row["message_id"], row["scope"])  # fmt: skip


def _identity(request: Any, app: Any) -> tuple[str, str, dt.datetime]:
    """The dedup identity of the running message (as the pool's Run computes it) and when
    its dedup window ends."""
    from celery import current_app

    from celery_beetle.settings import BeetleSettings
    from celery_beetle.worker.runnable import request_facts

    app = app or current_app
    task = app.tasks.get(str(getattr(request, "task", "") or ""))
    settings = getattr(task, "beetle_settings", None) or BeetleSettings.from_app(app)
    if not getattr(request, "delivery_info", None) and not getattr(request, "properties", None):
        raise InboxError("inbox.once needs the running task's self.request (bind=True)")
    facts = request_facts(request, settings)
    expires_ms = facts.expires_at_ms + settings.key_ttl_margin_ms
    expires_at = dt.datetime.fromtimestamp(expires_ms / 1000, dt.timezone.utc)
    return facts.scope[:255], facts.message_id[:255], expires_at


def sweep(
    bind: sa.Engine,
    *,
    batch_size: int = 500,
    max_batches: int = 20,
    clock: Callable[[], float] = time.time,
) -> int:
    """Delete expired inbox rows, ``batch_size`` per transaction (short locks, small WAL
    bursts), at most ``max_batches`` batches per call; the number deleted."""
    now = dt.datetime.fromtimestamp(clock(), dt.timezone.utc)
    deleted = 0
    for _ in range(max_batches):
        with bind.begin() as conn:
            expired = (
                sa.select(INBOX.c.scope, INBOX.c.message_id, INBOX.c.step)
                .where(INBOX.c.expires_at <= now)
                .limit(batch_size)
            )
            if conn.dialect.name == "postgresql":
                expired = expired.with_for_update(skip_locked=True)
            keys = sa.tuple_(INBOX.c.scope, INBOX.c.message_id, INBOX.c.step)
            count = conn.execute(sa.delete(INBOX).where(keys.in_(expired))).rowcount
        deleted += count
        if count < batch_size:
            break
    return deleted
