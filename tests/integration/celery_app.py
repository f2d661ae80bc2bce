"""A Celery app for worker subprocesses in integration tests.

Configured from the environment: ``BEETLE_TEST_URL`` (broker URL),
``BEETLE_TEST_OUT`` (file each task run appends one line to) and
``BEETLE_TEST_OPTIONS`` (JSON transport options).  A line is
``<task argument> <broker that delivered it> <pid>``, so tests can count runs
per message and per broker without a result backend.
"""

from __future__ import annotations

import json
import os
import time

from celery import Celery
from celery.signals import task_received

import kombu_beetle  # noqa: F401  (registers beetle://)

app = Celery("beetle_it", broker=os.environ.get("BEETLE_TEST_URL", "beetle://"))
app.conf.broker_transport_options = json.loads(os.environ.get("BEETLE_TEST_OPTIONS", "{}"))
app.conf.task_default_queue = os.environ.get("BEETLE_TEST_QUEUE", "celery")
app.conf.task_acks_late = True
app.conf.worker_prefetch_multiplier = 4
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
app.conf.result_backend = os.environ.get("BEETLE_TEST_BACKEND") or None
app.conf.broker_heartbeat = float(os.environ.get("BEETLE_TEST_HEARTBEAT", "120"))
OUT = os.environ.get("BEETLE_TEST_OUT", "/dev/null")

#: task id -> broker that delivered it (Celery keeps only some delivery_info keys,
#: so it is read from the message in the main process; tests use the solo pool)
DELIVERED_BY: dict[str, str] = {}


@task_received.connect
def remember_broker(request=None, **kwargs) -> None:  # type: ignore[no-untyped-def]
    message = getattr(request, "message", None)
    if message is not None:
        DELIVERED_BY[request.id] = message.delivery_info.get("beetle_broker", "?")


@app.task(bind=True, name="it.record")
def record(self, item: int, sleep_s: float = 0.0) -> int:
    if sleep_s:
        time.sleep(sleep_s)
    broker = DELIVERED_BY.pop(self.request.id, "?")
    with open(OUT, "a") as out:
        out.write(f"{item} {broker} {os.getpid()}\n")
    return item


@app.task(bind=True, name="it.record_early", acks_late=False)
def record_early(self, item: int, sleep_s: float = 0.0) -> int:
    """``it.record`` acked before it runs (Celery's default), writing its start too."""
    with open(OUT, "a") as out:
        out.write(f"-{item} started {os.getpid()}\n")
    return record(item, sleep_s)


@app.task(name="it.add")
def add(x: int, y: int) -> int:
    return x + y
