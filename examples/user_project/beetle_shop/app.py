"""The shop's Celery app: two BeetleTasks, configured as in production.

Nothing in it knows about tests: the pytest plugin imports this app and points it at the
test's brokers, dedup Redis and trace directory (``celery_beetle.testing.app.configure``).
"""

from __future__ import annotations

import os
import time

from celery import Celery

import celery_beetle
from celery_beetle import BeetleTask

app = Celery(
    "beetle_shop",
    broker=os.environ.get("SHOP_BROKER_URL", "beetle://guest:guest@rabbit-1:5672,rabbit-2:5672//"),
)
app.conf.beetle_redis_url = os.environ.get("SHOP_DEDUP_REDIS_URL", "redis://redis:6379/0")
app.conf.task_default_queue = "shop"
celery_beetle.install(app)

#: a run holds its lease for ``timeout`` s; a crash counts as an attempt, so allow a few
RELIABLE = {"timeout": 6, "attempts": 3, "exceptions": 1, "retry_delay": 1}


@app.task(base=BeetleTask, name="shop.charge_card", **RELIABLE)
def charge_card(order_id: int, seconds: float = 0.05) -> str:
    """Charge the card of an order: the task that must never run twice."""
    time.sleep(seconds)  # the payment provider's round trip
    return f"charged {order_id}"


@app.task(base=BeetleTask, name="shop.send_receipt", **RELIABLE)
def send_receipt(order_id: int) -> str:
    """Mail the receipt: twice would be a nuisance, never would be a complaint."""
    return f"receipt {order_id}"
