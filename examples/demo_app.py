"""The demo's Celery app: a BeetleTask that records each charge once, over two brokers.

Configured from the environment by ``examples/demo.py``: ``BEETLE_BROKER_URL``,
``BEETLE_REDIS_URL``, ``BEETLE_DEMO_DB`` (the database the charges are committed to),
``BEETLE_DEMO_DIR`` (each run of a body is appended to ``runs.log`` there and trace events
written under ``trace/``; while ``refunds-broken`` exists there, ``demo.refund`` fails and
is dead-lettered, for the demo's replay at the end).

``demo.charge`` commits its effect (a ``demo_charges`` row) through the inbox
(:mod:`celery_beetle.outbox.inbox`), in the transaction that marks the message done: a worker
killed after that commit and before the completion reached Redis has its message run again
(as beetle promises for a crashed body), and the second run finds the message marked and
records nothing. So every charge is recorded once, however the kill falls.

Each pool process writes its ``started`` trace events through at once (the tracer's default
buffers them for up to a second), so that the bodies the kill interrupts are in the trace:
started, never completed, in the killed worker.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from celery import Celery
from celery.signals import worker_process_init
from sqlalchemy.orm import Session

import celery_beetle
from celery_beetle import BeetleTask
from celery_beetle.outbox import inbox
from examples.demo_charges import CHARGES, engine_options
from kombu_beetle.trace import get_tracer

DEMO_DIR = Path(os.environ.get("BEETLE_DEMO_DIR", "/tmp/beetle-demo"))

app = Celery("beetle_demo", broker=os.environ.get("BEETLE_BROKER_URL", "beetle://"))
app.conf.beetle_redis_url = os.environ.get("BEETLE_REDIS_URL", "redis://127.0.0.1:6379/0")
app.conf.beetle_trace_dir = str(DEMO_DIR / "trace")
app.conf.broker_transport_options = {
    "confirm_timeout": 1.0,
    "reconnect_interval": 0.2,
    "reconnect_max_interval": 2.0,
    "trace_dir": str(DEMO_DIR / "trace"),
}
app.conf.worker_prefetch_multiplier = 4
app.conf.worker_hijack_root_logger = False
celery_beetle.install(app)


@worker_process_init.connect
def _trace_starts_at_once(**kwargs: Any) -> None:
    """The pool process's tracer (created here first, so the runs use it) writes through
    on ``started`` as on the outcomes."""
    outcomes = ("started", "completed", "dead_lettered", "expired")
    get_tracer(app.conf.beetle_trace_dir, role="worker", sync_events=outcomes)


@functools.cache
def _engine(pid: int) -> sa.Engine:
    """One engine per process (a prefork child must not share its parent's connections)."""
    from celery_beetle.outbox.db import engine_for

    url = os.environ["BEETLE_DEMO_DB"]
    return engine_for(url, **engine_options(url))


# attempts=3: the demo kills a worker in the middle of bodies, and a body that began counts as
# an attempt; its message runs again on the other worker, and the inbox keeps its charge once
@app.task(base=BeetleTask, bind=True, name="demo.charge", timeout=5, attempts=3)
def charge(self: Any, order_id: int) -> int:
    """Pretend to charge an order: one ``demo_charges`` row, committed through the inbox."""
    time.sleep(0.02)
    with Session(_engine(os.getpid())) as session, session.begin():
        first = inbox.once(session, self.request)
        if first:
            session.execute(sa.insert(CHARGES), [{"order_id": order_id, "pid": os.getpid()}])
    with open(DEMO_DIR / "runs.log", "a") as runs:
        runs.write(f"{order_id} {os.getpid()} {'charged' if first else 'found-committed'}\n")
    return order_id


@app.task(base=BeetleTask, name="demo.refund", timeout=5, attempts=1)
def refund(order_id: int) -> int:
    """Fails (a bug) while ``refunds-broken`` exists: its message is dead-lettered."""
    if (DEMO_DIR / "refunds-broken").exists():
        raise RuntimeError(f"refund {order_id}: the payment provider rejected the request")
    with open(DEMO_DIR / "refunds.log", "a") as runs:
        runs.write(f"{order_id} {os.getpid()}\n")
    return order_id
