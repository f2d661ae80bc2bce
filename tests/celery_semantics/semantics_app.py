"""A worker app whose default task class is BeetleTask, as a team adopting beetle writes it.

``Celery(..., task_cls="celery_beetle.task:BeetleTask")`` plus :func:`celery_beetle.install`,
a Redis result backend, every task option at its default. The module-level ``app`` (what
``celery -A`` loads) reads ``BEETLE_TEST_URL``, ``BEETLE_TEST_REDIS`` and
``BEETLE_TEST_BACKEND`` (``BEETLE_TEST_PLAIN=1``: plain Celery on a ``pyamqp://`` URL, the
comparison); each body appends ``<task> <args> <pid>`` to ``BEETLE_TEST_OUT``, so a test
counts runs as well as results.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

import celery_beetle

FAST = {"confirm_timeout": 1.0, "reconnect_interval": 0.2, "reconnect_max_interval": 1.0}


def make_app(
    broker_url: str, redis_url: str, backend: str, out: str = "/dev/null", plain: bool = False
) -> Celery:
    """The app; ``plain``: the same tasks as plain Celery tasks on one ``pyamqp://`` broker
    (the comparison: what Celery itself does)."""
    options = {} if plain else {"task_cls": "celery_beetle.task:BeetleTask"}
    app = Celery(
        "beetle_semantics", broker=broker_url, backend=backend, set_as_current=False, **options
    )
    app.conf.broker_transport_options = {} if plain else FAST
    app.conf.broker_connection_retry_on_startup = True
    app.conf.worker_hijack_root_logger = False
    app.conf.result_extended = True
    if not plain:
        app.conf.beetle_redis_url = redis_url
        celery_beetle.install(app)

    def ran(name: str, *args: Any) -> None:
        with open(out, "a") as f:
            f.write(f"{name} {' '.join(map(str, args))} {os.getpid()}\n")

    @app.task(name="sem.add", shared=False)
    def add(x: int, y: int) -> int:
        ran("add", x, y)
        return x + y

    @app.task(name="sem.replaced_by_add", bind=True, shared=False)
    def replaced_by_add(self: Any, x: int, y: int) -> Any:
        ran("replaced_by_add", x, y)
        return self.replace(add.si(x, y))

    @app.task(name="sem.replaced_twice", bind=True, shared=False)
    def replaced_twice(self: Any, x: int, y: int) -> Any:
        ran("replaced_twice", x, y)
        return self.replace(replaced_by_add.si(x, y))

    @app.task(name="sem.tsum", shared=False)
    def tsum(numbers: list[int]) -> int:
        ran("tsum", len(numbers))
        return sum(numbers)

    @app.task(name="sem.note", shared=False)
    def note(value: Any) -> Any:
        ran("note", value)
        return value

    @app.task(name="sem.sleeping", shared=False)
    def sleeping(seconds: float) -> None:
        ran("sleeping", seconds)
        time.sleep(seconds)

    @app.task(name="sem.fail", shared=False)
    def fail(x: int) -> None:
        ran("fail", x)
        raise ValueError(f"fail {x}")

    @app.task(name="sem.on_error", shared=False)
    def on_error(request: Any, exc: Any, traceback: Any) -> None:
        ran("on_error", type(exc).__name__)

    @app.task(name="sem.quiet", ignore_result=True, shared=False)
    def quiet(x: int) -> int:
        ran("quiet", x)
        return x

    # chord headers for the chaos test: a body long enough for a kill to land in it, and a
    # lease short enough that a body the kill interrupted is decided within the test
    @app.task(name="sem.slow", shared=False, timeout=8)
    def slow(x: int, y: int) -> int:
        ran("slow", x, y)
        time.sleep(0.4)
        return x + y

    @app.task(name="sem.slow_thrice", shared=False, timeout=8, attempts=3)
    def slow_thrice(x: int, y: int) -> int:
        ran("slow_thrice", x, y)
        time.sleep(0.4)
        return x + y

    return app


app = make_app(
    os.environ.get("BEETLE_TEST_URL", "beetle://localhost"),
    os.environ.get("BEETLE_TEST_REDIS", "redis://localhost"),
    os.environ.get("BEETLE_TEST_BACKEND", "redis://localhost/1"),
    os.environ.get("BEETLE_TEST_OUT", "/dev/null"),
    plain=os.environ.get("BEETLE_TEST_PLAIN") == "1",
)
