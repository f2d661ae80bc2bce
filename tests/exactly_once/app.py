"""A Celery app for exactly-once worker subprocesses (tests/exactly_once).

:func:`make_app` builds it; the module-level ``app`` (what ``celery -A`` loads) is configured
from the environment, so one module serves every scenario, and tests build their own
publisher with :func:`make_app` on the same brokers:

- ``BEETLE_TEST_URL`` broker URL, ``BEETLE_TEST_OPTIONS`` JSON transport options,
  ``BEETLE_TEST_QUEUE`` the queue (or ``q1,q2``: the worker consumes both, publishes to
  the first), ``BEETLE_TEST_REDIS`` the dedup store,
  ``BEETLE_TEST_BACKEND`` an optional result backend, ``BEETLE_TEST_TRACE`` a trace dir;
- ``BEETLE_TEST_TASK`` JSON BeetleTask options for the ``eo.*`` tasks
  (``timeout``, ``attempts``, ``exceptions``, ``delay``, ``max_delay``);
- ``BEETLE_TEST_CONF`` JSON of more ``app.conf`` settings (e.g. ``beetle_redis_wait_replicas``);
  with ``beetle_outbox_db`` in it, the worker relays the outbox too (``install_relay``);
- ``BEETLE_TEST_SLOW`` a factor on ``eo.record``'s sleep (``0`` for a worker that must not
  sleep, e.g. the one taking over from a worker killed mid-sleep);
- ``BEETLE_TEST_NEWER`` ``1`` registers ``eo.newer``, a task only the "newer version" of the
  app has (a rolling deploy's older workers do not know it);
- ``BEETLE_TEST_BROKEN`` a file whose existence makes ``eo.fixable`` fail (a bug "fixed"
  by deleting it, before a dead letter is replayed);
- ``BEETLE_TEST_PLAIN`` ``1``: the app *before* beetle (a fleet on ``pyamqp://``): no
  ``celery_beetle.install``, ``eo.record`` a plain Celery task; its body writes the
  ``started``/``completed`` trace events a BeetleTask run writes, so the audit counts the
  runs of the old fleet too (instrumentation of the test, not of the product);
- ``BEETLE_TEST_OUT`` a file every run appends lines to:
  ``<event> <item> <pid> <unix time>``, event ``start`` or ``done``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

import celery_beetle
from celery_beetle import BeetleTask

DEFAULT_OPTIONS: dict[str, Any] = {
    "timeout": 10,
    "attempts": 3,
    "exceptions": 2,
    "retry_delay": 0.5,
    "max_delay": 2,
}


def make_app(
    broker_url: str,
    redis_url: str,
    *,
    transport_options: dict[str, Any] | None = None,
    queue: str = "celery",
    backend: str | None = None,
    trace_dir: str | None = None,
    task_options: dict[str, Any] | None = None,
    out: str = "/dev/null",
    conf: dict[str, Any] | None = None,
    newer: bool = False,
    plain: bool = False,
) -> Celery:
    app = Celery("beetle_eo", broker=broker_url, set_as_current=False)
    app.conf.broker_transport_options = transport_options or {}
    app.conf.task_default_queue = queue.split(",")[0]
    app.conf.worker_prefetch_multiplier = 4
    app.conf.broker_connection_retry_on_startup = True
    app.conf.worker_hijack_root_logger = False
    app.conf.result_backend = backend or None
    app.conf.beetle_redis_url = redis_url
    app.conf.beetle_trace_dir = trace_dir or None
    app.conf.update(conf or {})
    if not plain:
        celery_beetle.install(app)
    if app.conf.get("beetle_outbox_db"):
        from celery_beetle.outbox import install_relay

        install_relay(app)
    options = {**DEFAULT_OPTIONS, **(task_options or {})}

    def note(event: str, item: int) -> None:
        with open(out, "a") as f:
            f.write(f"{event} {item} {os.getpid()} {time.time():.3f}\n")

    def record_body(item: int, sleep_s: float) -> int:
        note("start", item)
        if sleep_s:
            time.sleep(sleep_s * float(os.environ.get("BEETLE_TEST_SLOW", "1")))
        note("done", item)
        return item

    if plain:

        @app.task(bind=True, name="eo.record", shared=False, acks_late=True)
        def plain_record(self: Any, item: int, sleep_s: float = 0.0) -> int:
            from kombu_beetle.trace import get_tracer

            tracer = get_tracer(trace_dir, role="worker")
            queue = (self.request.delivery_info or {}).get("routing_key") or "celery"
            fields = {"task_name": "eo.record", "task_id": self.request.id, "attempt": 1}
            tracer.emit("started", self.request.id, queue=queue, **fields)
            result = record_body(item, sleep_s)
            tracer.emit("completed", self.request.id, queue=queue, **fields)
            tracer.flush()
            return result

    else:

        @app.task(base=BeetleTask, name="eo.record", shared=False, **options)
        def record(item: int, sleep_s: float = 0.0) -> int:
            return record_body(item, sleep_s)

    @app.task(base=BeetleTask, name="eo.stubborn", shared=False, **options)
    def stubborn(item: int, sleep_s: float) -> int:
        """Sleeps ``sleep_s`` whatever its soft time limit says: only the hard one ends it."""
        from celery.exceptions import SoftTimeLimitExceeded

        note("start", item)
        deadline = time.monotonic() + sleep_s
        while time.monotonic() < deadline:
            try:
                time.sleep(deadline - time.monotonic())
            except SoftTimeLimitExceeded:
                pass
        note("done", item)
        return item

    @app.task(base=BeetleTask, name="eo.flaky", shared=False, **options)
    def flaky(item: int) -> None:
        note("start", item)
        raise RuntimeError(f"flaky {item} fails every time")

    @app.task(
        base=BeetleTask, name="eo.picky", shared=False, **{**options, "retry_on": (ValueError,)}
    )
    def picky(item: int) -> None:
        note("start", item)
        raise KeyError(f"picky {item} is not worth a retry")

    @app.task(
        base=BeetleTask, name="eo.fixable", shared=False, **{**options, "retry_on": (ValueError,)}
    )
    def fixable(item: int) -> int:
        note("start", item)
        if os.path.exists(os.environ.get("BEETLE_TEST_BROKEN", "/nonexistent")):
            raise KeyError(f"fixable {item} is broken until the file goes")
        note("done", item)
        return item

    @app.task(base=BeetleTask, name="eo.unencodable", shared=False, **options)
    def unencodable(item: int) -> set[int]:
        note("start", item)
        note("done", item)
        return {item}  # JSON cannot encode a set: the result backend's store fails

    if newer:

        @app.task(base=BeetleTask, name="eo.newer", shared=False, **options)
        def newer_task(item: int) -> int:
            note("start", item)
            note("done", item)
            return item

    @app.task(name="eo.plain", shared=False)
    def plain(item: int) -> int:
        note("start", item)
        note("done", item)
        return item

    return app


app = make_app(
    os.environ.get("BEETLE_TEST_URL", "beetle://"),
    os.environ.get("BEETLE_TEST_REDIS", "redis://localhost:6379/15"),
    transport_options=json.loads(os.environ.get("BEETLE_TEST_OPTIONS", "{}")),
    queue=os.environ.get("BEETLE_TEST_QUEUE", "celery"),
    backend=os.environ.get("BEETLE_TEST_BACKEND"),
    trace_dir=os.environ.get("BEETLE_TEST_TRACE"),
    task_options=json.loads(os.environ.get("BEETLE_TEST_TASK", "{}")),
    out=os.environ.get("BEETLE_TEST_OUT", "/dev/null"),
    conf=json.loads(os.environ.get("BEETLE_TEST_CONF", "{}")),
    newer=os.environ.get("BEETLE_TEST_NEWER") == "1",
    plain=os.environ.get("BEETLE_TEST_PLAIN") == "1",
)
