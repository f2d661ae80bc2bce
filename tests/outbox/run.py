"""One outbox scenario: orders committed with their tasks, relays, workers, then the audit.

An :class:`OutboxRun` commits orders (a business row and ``eo.record(i)`` in one
transaction, through :func:`celery_beetle.outbox.delay`), runs relays as subprocesses
(``beetle relay``, killable by pid), starts BeetleTask workers, and judges the run with the
Spark audit: every committed order's task ran once (``completed_once``), nothing lost,
duplicated, unexpected or ``never_relayed``; a rolled-back order's task never ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from celery_beetle.testing.waiting import wait_until
from celery_beetle.testing.worker import WorkerProcess
from tests.chaos.run import FAST, TASK_OPTIONS

#: the repository: the workers run its test apps
ROOT = Path(__file__).resolve().parents[2]

ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("task_id", sa.String(64), nullable=False),
)


def create_orders(engine: sa.Engine) -> None:
    ORDERS.metadata.create_all(engine)


class Rollback(Exception):
    """Raised inside a transaction to roll it back."""


class OutboxRun:
    """Workers, relays, an enqueuing app and the files they leave, for one scenario."""

    def __init__(
        self, name: str, brokers: Any, redis_url: str, base: Path, db_url: str, **conf: Any
    ) -> None:
        from celery_beetle.outbox.db import engine_for
        from tests.exactly_once.app import make_app

        self.name, self.brokers, self.redis_url, self.base = name, brokers, redis_url, base
        self.db_url = db_url
        self.trace_dir = base / "trace"
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self.url = brokers.beetle_url
        self.app = make_app(
            self.url,
            redis_url,
            transport_options=dict(FAST),
            trace_dir=str(self.trace_dir),
            task_options=TASK_OPTIONS,
        )
        self.engine = engine_for(db_url)
        self.workers: list[WorkerProcess] = []
        self.relays: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []
        self.rolled_back: dict[int, str] = {}
        self.errors: list[BaseException] = []

    # -- the application side ------------------------------------------------------------

    def commit_order(self, item: int, *, rollback: bool = False, sleep_s: float = 0.0) -> None:
        """One transaction: the order row and its task; rolled back when asked.

        A transaction that fails with the database is tried again, as an application
        would; a commit whose answer was lost may have committed, so what counts as
        committed is read back from ``orders`` (:meth:`committed_items`), never assumed.
        """
        from celery_beetle import outbox

        task = self.app.tasks["eo.record"]
        for _ in range(300):
            try:
                with Session(self.engine) as session, session.begin():
                    result = outbox.delay(session, task, item, sleep_s)
                    session.execute(sa.insert(ORDERS), [{"id": item, "task_id": result.id}])
                    if rollback:
                        self.rolled_back[item] = result.id
                        raise Rollback()
                return
            except Rollback:
                return
            except sa.exc.IntegrityError:
                return  # the earlier try did commit: the order is there
            except sa.exc.DBAPIError as exc:
                if not exc.connection_invalidated and not isinstance(
                    exc, (sa.exc.OperationalError, sa.exc.InterfaceError)
                ):
                    raise
                time.sleep(0.1)
        raise RuntimeError(f"order {item}: the database did not come back")

    def committed_items(self) -> dict[int, str]:
        """``{order: task id}`` of the committed orders, from the database."""
        with self.engine.connect() as conn:
            return {row.id: row.task_id for row in conn.execute(sa.select(ORDERS))}

    def commit_orders(
        self, items: range, *, interval_s: float = 0.0, background: bool = False
    ) -> threading.Thread | None:
        def go() -> None:
            for item in items:
                try:
                    self.commit_order(item)
                except Exception as exc:  # counted: the test asserts there are none
                    self.errors.append(exc)
                if interval_s:
                    time.sleep(interval_s)

        if not background:
            go()
            return None
        thread = threading.Thread(target=go, daemon=True, name="orders")
        thread.start()
        return thread

    # -- processes -----------------------------------------------------------------------

    def start_worker(
        self, *, concurrency: int = 2, extra_env: dict[str, str] | None = None
    ) -> WorkerProcess:
        out = self.base / f"worker{len(self.workers)}.out"
        out.touch()
        env = {
            "BEETLE_TEST_URL": self.url,
            "BEETLE_TEST_REDIS": self.redis_url,
            "BEETLE_TEST_OUT": str(out),
            "BEETLE_TEST_OPTIONS": json.dumps(FAST),
            "BEETLE_TEST_TASK": json.dumps(TASK_OPTIONS),
            "BEETLE_TEST_TRACE": str(self.trace_dir),
            **(extra_env or {}),
        }
        worker = WorkerProcess(
            "tests.exactly_once.app",
            out.with_suffix(".log"),
            env,
            pool="prefork",
            concurrency=concurrency,
            name=f"outbox{len(self.workers)}",
            root=ROOT,
        )
        self.workers.append(worker.start())
        self.outs.append(out)
        return worker

    def start_relay(
        self, *, crash_chance: float = 0.0, batch_size: int = 50, url: str | None = None
    ) -> subprocess.Popen[bytes]:
        """``beetle relay`` as a subprocess (killing itself after a publish at that chance)."""
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "BEETLE_OUTBOX_DB": self.db_url,
            "BEETLE_BROKER_URL": url or self.url,
            "BEETLE_RELAY_CRASH": str(crash_chance),
            "BEETLE_TEST_URL": url or self.url,
            "BEETLE_TEST_REDIS": self.redis_url,
            "BEETLE_TEST_OPTIONS": json.dumps(FAST),
            "BEETLE_TEST_TRACE": str(self.trace_dir),
        }
        log = (self.base / f"relay{len(self.relays)}.log").open("ab")
        args = [sys.executable, "-m", "tests.outbox.relay_process",
                "-A", "tests.exactly_once.app:app", "--batch-size", str(batch_size)]  # fmt: skip
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        log.close()
        self.relays.append(proc)
        return proc

    def wait_relays_ready(self, timeout: float = 60) -> None:
        """Until every relay started says it is relaying (a loaded machine starts a Python
        process in seconds, long enough for the first relay to take every row alone)."""

        def ready() -> bool:
            return self.relay_logs().count("beetle relay: relaying") >= len(self.relays)

        assert wait_until(ready, timeout=timeout), self.relay_logs()[-2000:]

    def relay_logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.base.glob("relay*.log"))
        )

    # -- progress ------------------------------------------------------------------------

    def done_items(self) -> list[int]:
        items: list[int] = []
        for out in self.outs:
            for line in out.read_text().splitlines():
                event, item, _pid, _ts = line.split()
                if event == "done":
                    items.append(int(item))
        return items

    def waiting_rows(self) -> int:
        from celery_beetle.outbox.table import OUTBOX

        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(OUTBOX)).scalar_one())

    def wait_all_done(self, timeout: float = 60) -> set[int]:
        wanted = set(self.committed_items())
        wait_until(lambda: wanted <= set(self.done_items()), timeout=timeout, interval=0.2)
        return wanted - set(self.done_items())

    def stop(self) -> None:
        for relay in self.relays:
            if relay.poll() is None:
                relay.terminate()
                relay.wait(10)
        for worker in self.workers:
            worker.stop()

    def kill_all(self) -> None:
        for relay in self.relays:
            if relay.poll() is None:
                relay.kill()
                relay.wait()
        for worker in self.workers:
            worker.kill()
        self.engine.dispose()

    # -- verdict -------------------------------------------------------------------------

    def judge(self, spark: Any) -> dict[str, Any]:
        """Audit the run and assert: each committed order's task once, nothing bad."""
        from celery_beetle.audit.job import run_audit
        from kombu_beetle.trace import flush_all

        self.stop()
        flush_all()
        assert self.errors == []
        summary = run_audit(spark, str(self.trace_dir), str(self.base / "audit")).summary
        bad = {k: v for k, v in summary["samples"].items() if v}
        counts = {k: summary[k] for k in ("lost", "duplicated", "unexpected", "never_relayed")}
        assert counts == dict.fromkeys(counts, 0), bad
        committed = self.committed_items()
        assert summary["completed_once"] == len(committed), summary
        ran = self.done_items()
        assert sorted(ran) == sorted(committed), "a task ran twice, or never"
        assert not set(ran) & set(self.rolled_back), "a rolled-back order's task ran"
        assert self.waiting_rows() == 0
        return summary
