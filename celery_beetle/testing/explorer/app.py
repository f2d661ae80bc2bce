"""The tasks the explorer's workers run, configured from the environment.

``celery -A celery_beetle.testing.explorer.app worker`` loads ``app``; the explorer's
publisher builds the same app with :func:`make_app`. Environment:

- ``EXPLORER_URL`` (``beetle://``), ``EXPLORER_REDIS``, ``EXPLORER_QUEUE``,
  ``EXPLORER_TRACE`` (trace dir), ``EXPLORER_LEDGER`` (ledger dir, :mod:`.ledger`);
- ``EXPLORER_TASK``: JSON BeetleTask options (``attempts``, ``exceptions``, ``timeout``,
  ``acks_late``...), ``EXPLORER_CONF``: JSON ``app.conf`` settings (prefetch, queue type);
- ``EXPLORER_DB``: a PostgreSQL URL for ``ex.inbox`` (its ``explorer_effects`` table).

Tasks (each writes ``start``/``end``/``fail`` to the ledger; the key is the task id; a
worker without ``EXPLORER_TRACE`` marks each line ``untraced``):

- ``ex.work(mode, sleep_s)``: ``ok`` sleeps and returns; ``long`` sleeps half the lease;
  ``overrun`` sleeps 1.5 leases (prefork's hard limit ends it; other pools extend the lease);
  ``fail`` raises RuntimeError (worth a retry) every time; ``flaky`` raises on its first
  start only (the ledger says whether it started before); ``fatal`` raises KeyError (not in
  ``retry_on``: dead-lettered at once);
- ``ex.inbox(sleep_s)``: inserts its effect row behind ``inbox.once`` in one transaction,
  notes ``committed``, then sleeps ``sleep_s`` (the window where a kill finds the effect
  committed and the completion not stored);
- ``ex.plain(sleep_s)``: a plain Celery task (one broker, acked early, as on pyamqp);
- ``ex.join(results, expected)``: a chord's body: returns when ``results`` (the header
  tasks' return values, their keys) are ``expected``, else raises KeyError (not worth a
  retry: dead-lettered, which the table does not allow);
- ``ex.retry(retries, retry_s, sleep_s, past_max=False)``: sleeps, then calls
  ``self.retry(countdown=retry_s, max_retries=retries)`` until Celery's ``retries`` reach
  ``retries``, then returns. Each retry is a new message, ``<task id>:retry-N`` (README
  "Celery features"), so the ledger keys each run by that message id
  (:func:`celery_beetle.task.message_id_for`) and notes ``retry`` before the call.
  ``retry_s`` 0: no countdown (the task's ``default_retry_delay``, :data:`RETRY_DELAY_S`).
  ``past_max``: the last run calls ``self.retry`` once more, and Celery raises
  ``MaxRetriesExceededError`` in the body (noted ``fail``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import sqlalchemy as sa
from celery import Celery
from sqlalchemy.orm import Session

import celery_beetle
from celery_beetle import BeetleTask
from celery_beetle.outbox import inbox
from celery_beetle.testing.explorer.ledger import note, read_dir
from celery_beetle.testing.explorer.scenario import RETRY_DELAY_S

EFFECTS = sa.Table(
    "explorer_effects",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(255), nullable=False),  # no unique key: a repeat shows
)

_engines: dict[int, sa.Engine] = {}


def _engine(url: str) -> sa.Engine:
    """One engine per process: a pool process must not share its parent's connections."""
    pid = os.getpid()
    if pid not in _engines:
        from celery_beetle.outbox.db import engine_for

        _engines[pid] = engine_for(url, pool_size=1)
    return _engines[pid]


def make_app(
    url: str,
    redis_url: str,
    *,
    queue: str = "explore",
    trace_dir: str | None = None,
    ledger_dir: str = "/tmp",
    task_options: dict[str, Any] | None = None,
    conf: dict[str, Any] | None = None,
    transport_options: dict[str, Any] | None = None,
    db_url: str | None = None,
) -> Celery:
    app = Celery("explorer", broker=url, set_as_current=False)
    app.conf.broker_transport_options = transport_options or {}
    app.conf.task_default_queue = queue
    app.conf.broker_connection_retry_on_startup = True
    app.conf.worker_hijack_root_logger = False
    app.conf.beetle_redis_url = redis_url
    app.conf.beetle_trace_dir = trace_dir
    app.conf.update(conf or {})
    celery_beetle.install(app)
    options = {**(task_options or {}), "retry_on": (RuntimeError,)}
    # a worker with tracing off says so on every ledger line: the checker then judges its
    # messages by the ledger and the brokers alone
    untraced = {} if trace_dir else {"untraced": True}

    def mark(event: str, key: str, **fields: Any) -> None:
        note(ledger_dir, event, key, **untraced, **fields)

    lease_s = float(options.get("timeout", 300))

    @app.task(base=BeetleTask, bind=True, name="ex.work", shared=False, **options)
    def work(self: Any, mode: str, sleep_s: float) -> str:
        key = str(self.request.id)
        earlier = len(read_dir(ledger_dir).entry(key).starts) if mode == "flaky" else 0
        mark("start", key, mode=mode)
        if mode == "long":
            sleep_s = lease_s / 2
        elif mode == "overrun":
            sleep_s = lease_s * 1.5
        time.sleep(sleep_s)
        if mode == "fail" or (mode == "flaky" and not earlier):
            mark("fail", key)
            raise RuntimeError(f"{mode} body of {key} fails")
        if mode == "fatal":
            mark("fail", key)
            raise KeyError(f"fatal body of {key}")
        mark("end", key)
        return key

    @app.task(base=BeetleTask, bind=True, name="ex.inbox", shared=False, **options)
    def inbox_task(self: Any, sleep_s: float) -> str:
        # its modules are imported with the app, as the worker starts: a pool process's
        # first inbox body took over 4 s to import them on a loaded machine, past its soft
        # time limit, and was dead-lettered as a failure the scenario never asked for
        key = str(self.request.id)
        mark("start", key)
        assert db_url, "ex.inbox needs EXPLORER_DB"
        with Session(_engine(db_url)) as session, session.begin():
            if not inbox.once(session, self.request):
                mark("end", key, skipped=True)
                return key
            session.execute(sa.insert(EFFECTS), [{"key": key}])
        mark("committed", key)
        time.sleep(sleep_s)
        mark("end", key)
        return key

    @app.task(
        base=BeetleTask, bind=True, name="ex.retry", shared=False,
        default_retry_delay=RETRY_DELAY_S, **options,
    )  # fmt: skip
    def retry_task(
        self: Any, retries: int, retry_s: float, sleep_s: float, past_max: bool = False
    ) -> str:
        from celery_beetle.task import message_id_for

        key = message_id_for(str(self.request.id), self.request.retries)
        mark("start", key)
        time.sleep(sleep_s)
        more = (self.request.retries or 0) < retries
        if more or past_max:
            mark("retry" if more else "fail", key)
            raise self.retry(countdown=retry_s or None, max_retries=retries)
        mark("end", key)
        return key

    @app.task(base=BeetleTask, bind=True, name="ex.join", shared=False, **options)
    def join(self: Any, results: list[str], expected: list[str]) -> str:
        key = str(self.request.id)
        mark("start", key)
        if sorted(results) != sorted(expected):
            mark("fail", key)
            raise KeyError(f"chord body {key} got {sorted(results)}, not {sorted(expected)}")
        mark("end", key)
        return key

    @app.task(bind=True, name="ex.plain", shared=False)
    def plain(self: Any, sleep_s: float) -> str:
        key = str(self.request.id)
        mark("start", key)
        time.sleep(sleep_s)
        mark("end", key)
        return key

    return app


def _env_json(name: str) -> dict[str, Any]:
    return dict(json.loads(os.environ.get(name) or "{}"))


app = make_app(
    os.environ.get("EXPLORER_URL", "beetle://"),
    os.environ.get("EXPLORER_REDIS", "redis://127.0.0.1:6379/15"),
    queue=os.environ.get("EXPLORER_QUEUE", "explore"),
    trace_dir=os.environ.get("EXPLORER_TRACE") or None,
    ledger_dir=os.environ.get("EXPLORER_LEDGER", "/tmp"),
    task_options=_env_json("EXPLORER_TASK"),
    conf=_env_json("EXPLORER_CONF"),
    transport_options=_env_json("EXPLORER_OPTIONS"),
    db_url=os.environ.get("EXPLORER_DB") or None,
)
