"""Exactly-once Celery tasks over two (or more) RabbitMQ brokers: a runnable example.

Every ``charge`` message is written to two brokers; a worker runs it once, whatever the
copies, reconnects and crashes. A failure with a ``ConnectionError`` is retried after 2 s,
4 s, 8 s...; any other exception, or a fourth failure, sends the message to the
``orders.dead`` queue with the reason in its headers.

Run it (brokers and Redis from the environment)::

    export BEETLE_BROKER_URL="beetle://guest:guest@localhost:5672,localhost:5673//"
    export BEETLE_REDIS_URL="redis://localhost:6379/0"
    celery -A examples.exactly_once_app worker -Q orders -l info

and, from another shell::

    python -m examples.exactly_once_app 42      # publishes charge(42) and ping(42)

``ping`` is a plain Celery task: it goes to one broker and is not deduplicated.
"""

from __future__ import annotations

import os
import random
import sys

from celery import Celery

import celery_beetle
from celery_beetle import BeetleTask

app = Celery(
    "exactly_once_example",
    broker=os.environ.get("BEETLE_BROKER_URL", "beetle://guest:guest@localhost:5672//"),
)
app.conf.beetle_redis_url = os.environ.get("BEETLE_REDIS_URL", "redis://localhost:6379/0")
app.conf.beetle_trace_dir = os.environ.get("BEETLE_TRACE_DIR") or None
app.conf.task_default_queue = "orders"
app.conf.beetle_default_timeout = 60  # lease per run; the hard time limit is derived from it
celery_beetle.install(app)


@app.task(
    base=BeetleTask,
    name="shop.charge",
    attempts=4,
    exceptions=3,
    retry_delay=2,
    max_delay=60,
    retry_on=(ConnectionError,),
)
def charge(order_id: int) -> str:
    """Charge an order once. A flaky payment provider makes it fail now and then."""
    if random.random() < 0.2:
        raise ConnectionError("payment provider timed out")
    return f"order {order_id} charged"


@app.task(name="shop.ping")
def ping(n: int) -> int:
    return n


if __name__ == "__main__":
    order = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print("charge:", charge.delay(order).id)
    print("ping:", ping.delay(order).id)
