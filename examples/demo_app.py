"""The demo's Celery app: a BeetleTask that counts its runs, over two brokers.

Configured from the environment by ``examples/demo.py``: ``BEETLE_BROKER_URL``,
``BEETLE_REDIS_URL``, ``BEETLE_DEMO_DIR`` (runs are appended to ``runs.log`` there and trace
events written under ``trace/``; while ``refunds-broken`` exists there, ``demo.refund``
fails and is dead-lettered, for the demo's replay at the end).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery

import celery_beetle
from celery_beetle import BeetleTask

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


@app.task(base=BeetleTask, name="demo.charge", timeout=5, attempts=3)
def charge(order_id: int) -> int:
    """Pretend to charge an order; each run is recorded, so the demo can count runs."""
    time.sleep(0.02)
    with open(DEMO_DIR / "runs.log", "a") as runs:
        runs.write(f"{order_id} {os.getpid()}\n")
    return order_id


@app.task(base=BeetleTask, name="demo.refund", timeout=5, attempts=1)
def refund(order_id: int) -> int:
    """Fails (a bug) while ``refunds-broken`` exists: its message is dead-lettered."""
    if (DEMO_DIR / "refunds-broken").exists():
        raise RuntimeError(f"refund {order_id}: the payment provider rejected the request")
    with open(DEMO_DIR / "refunds.log", "a") as runs:
        runs.write(f"{order_id} {os.getpid()}\n")
    return order_id
