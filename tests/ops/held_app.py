"""A worker app for the migration tests, with every task option at its default.

``held.record(item)`` is a BeetleTask with no options (``attempts=1``, BeetleTask's
``acks_late``) and the worker keeps Celery's default prefetch; each run appends
``done <item> <pid>`` to ``BEETLE_TEST_OUT``. The module-level ``app`` (what ``celery -A``
loads) reads ``BEETLE_TEST_URL`` and ``BEETLE_TEST_REDIS``; tests publish with
:func:`make_app` on the same brokers.
"""

from __future__ import annotations

import os

from celery import Celery

import celery_beetle
from celery_beetle import BeetleTask

#: short transport timeouts, so that a test's faults settle quickly
FAST = {"confirm_timeout": 1.0, "reconnect_interval": 0.2, "reconnect_max_interval": 1.0}


def make_app(broker_url: str, redis_url: str, out: str = "/dev/null") -> Celery:
    app = Celery("beetle_held", broker=broker_url, set_as_current=False)
    app.conf.broker_transport_options = FAST
    app.conf.broker_connection_retry_on_startup = True
    app.conf.worker_hijack_root_logger = False
    app.conf.beetle_redis_url = redis_url
    celery_beetle.install(app)

    @app.task(base=BeetleTask, name="held.record", shared=False)
    def record(item: int) -> int:
        with open(out, "a") as f:
            f.write(f"done {item} {os.getpid()}\n")
        return item

    return app


app = make_app(
    os.environ.get("BEETLE_TEST_URL", "beetle://localhost"),
    os.environ.get("BEETLE_TEST_REDIS", "redis://localhost"),
    os.environ.get("BEETLE_TEST_OUT", "/dev/null"),
)
