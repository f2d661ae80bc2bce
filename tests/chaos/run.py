"""One chaos scenario: publishers and workers with tracing on, a fault, then the audit.

A :class:`ChaosRun` starts BeetleTask workers (subprocesses of ``tests.exactly_once.app``)
and a publisher thread on real brokers and Redis, lets a scenario inject its fault, waits
until every confirmed message has run, stops the workers warmly (so their traces are
written) and judges the run with ``beetle audit``'s Spark job: nothing lost, nothing run
twice, nothing unexpected.  The workers' own "done" lines only pace the test; the verdict
comes from the audit.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kombu import Connection

from celery_beetle.testing.worker import WorkerProcess

#: the repository: the workers run its test apps
ROOT = Path(__file__).resolve().parents[2]

#: short transport timeouts, so that a fault is noticed and healed within seconds
FAST = {
    "confirm_timeout": 1.0,
    "reconnect_interval": 0.2,
    "reconnect_max_interval": 1.0,
    "connect_timeout": 1.0,
}
#: a short lease, so that a task of a killed worker is taken over quickly
TASK_OPTIONS = {"timeout": 4, "attempts": 5, "exceptions": 4, "retry_delay": 0.2, "max_delay": 1}


@dataclass
class ChaosResult:
    scenario: str
    published: int
    lost: int
    duplicated: int
    unexpected: int
    completed_once: int
    recover_s: float
    elapsed_s: float
    summary: dict[str, Any] = field(repr=False, default_factory=dict)


class Publisher(threading.Thread):
    """Publishes ``eo.record(i)`` at a steady pace, remembering what was confirmed."""

    def __init__(self, app: Any, url: str, count: int, interval_s: float, sleep_s: float):
        super().__init__(daemon=True, name="chaos-publisher")
        self.app, self.url, self.count = app, url, count
        self.interval_s, self.sleep_s = interval_s, sleep_s
        self.confirmed: list[int] = []
        self.errors: list[BaseException] = []
        self.done = threading.Event()

    def run(self) -> None:
        task = self.app.tasks["eo.record"]
        policy = {"max_retries": 60, "interval_start": 0.2, "interval_step": 0.2,
                  "interval_max": 0.5}  # fmt: skip
        try:
            with Connection(
                self.url, transport_options=self.app.conf.broker_transport_options
            ) as c:
                for i in range(self.count):
                    try:
                        task.apply_async((i, self.sleep_s), connection=c, retry_policy=policy)
                    except Exception as exc:  # counted: the test asserts there are none
                        self.errors.append(exc)
                        continue
                    self.confirmed.append(i)
                    time.sleep(self.interval_s)
        finally:
            self.done.set()


class ChaosRun:
    """Workers, a publisher and the files they leave, for one scenario."""

    def __init__(
        self,
        name: str,
        brokers: Any,
        redis_url: str,
        base: Path,
        *,
        conf: dict[str, Any] | None = None,
        task_options: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.brokers = brokers
        self.redis_url = redis_url
        self.conf = conf or {}  # more app.conf settings for the workers
        self.task_options = {**TASK_OPTIONS, **(task_options or {})}
        self.base = base
        self.trace_dir = base / "trace"
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self.workers: list[WorkerProcess] = []
        self.outs: list[Path] = []
        self.publisher: Publisher | None = None
        self.started = time.monotonic()
        self.fault_at: float | None = None

    # -- processes -----------------------------------------------------------------------

    def start_worker(
        self,
        url: str | None = None,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        conf: dict[str, Any] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        """A worker on ``url``; ``conf``: app settings of this worker only, over the run's;
        ``extra_env``: more of the app's environment (``BEETLE_TEST_BROKEN``, ...)."""
        out = self.base / f"worker{len(self.workers)}.out"
        out.touch()
        env = {
            "BEETLE_TEST_URL": url or self.brokers.beetle_url,
            "BEETLE_TEST_REDIS": self.redis_url,
            "BEETLE_TEST_OUT": str(out),
            "BEETLE_TEST_OPTIONS": json.dumps(FAST),
            "BEETLE_TEST_TASK": json.dumps(self.task_options),
            "BEETLE_TEST_TRACE": str(self.trace_dir),
            "BEETLE_TEST_CONF": json.dumps({**self.conf, **(conf or {})}),
            **(extra_env or {}),
        }
        worker = WorkerProcess(
            "tests.exactly_once.app",
            out.with_suffix(".log"),
            env,
            pool=pool,
            concurrency=concurrency,
            name=f"chaos{len(self.workers)}",
            root=ROOT,
        )
        self.workers.append(worker.start())
        self.outs.append(out)
        return worker

    def start_publisher(
        self, count: int, *, url: str | None = None, interval_s: float = 0.01, sleep_s: float = 0.02
    ) -> Publisher:
        from tests.exactly_once.app import make_app

        url = url or self.brokers.beetle_url
        options = {**FAST, "trace_dir": str(self.trace_dir)}
        app = make_app(
            url, self.redis_url, transport_options=options, task_options=self.task_options
        )
        self.publisher = Publisher(app, url, count, interval_s, sleep_s)
        self.publisher.start()
        return self.publisher

    # -- progress ------------------------------------------------------------------------

    def done_lines(self) -> list[tuple[int, float]]:
        lines: list[tuple[int, float]] = []
        for out in self.outs:
            for line in out.read_text().splitlines():
                event, item, _pid, ts = line.split()
                if event == "done":
                    lines.append((int(item), float(ts)))
        return lines

    def wait_published(self, at_least: int, timeout: float = 60) -> None:
        assert self.publisher is not None
        deadline = time.monotonic() + timeout
        while len(self.publisher.confirmed) < at_least and not self.publisher.done.is_set():
            assert time.monotonic() < deadline, "publisher made no progress"
            time.sleep(0.05)

    def begin(
        self, messages: int, *, workers: int = 2, url: str | None = None, sleep_s: float = 0.02
    ) -> list[WorkerProcess]:
        """Start ``workers`` and the publisher; return once a third is published, fault time."""
        started = [self.start_worker(url) for _ in range(workers)]
        self.start_publisher(messages, url=url, sleep_s=sleep_s)
        self.wait_published(messages // 3)
        self.fault()
        return started

    def fault(self) -> None:
        """Mark the moment the fault is injected (for the time to recover)."""
        self.fault_at = time.time()

    def wait_all_done(self, timeout: float = 120) -> set[int]:
        assert self.publisher is not None
        self.publisher.join(timeout)
        wanted = set(self.publisher.confirmed)
        deadline = time.monotonic() + timeout
        missing = wanted
        while time.monotonic() < deadline:
            missing = wanted - {i for i, _ in self.done_lines()}
            if not missing:
                break
            time.sleep(0.2)
        return missing

    def recover_s(self) -> float:
        """The longest time without a completed task, from the fault until the last task ran.

        This is the time to recover as a user sees it: how long the system made no progress.
        """
        if self.fault_at is None:
            return 0.0
        stamps = sorted(ts for _, ts in self.done_lines() if ts >= self.fault_at)
        if not stamps:
            return float("nan")
        gaps = [b - a for a, b in zip([self.fault_at, *stamps[:-1]], stamps, strict=True)]
        return round(max(gaps), 2)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.kill()

    # -- verdict -------------------------------------------------------------------------

    def audit(self, spark: Any) -> ChaosResult:
        from celery_beetle.audit.job import run_audit
        from kombu_beetle.trace import flush_all

        flush_all()  # the publisher's events, written by this process
        result = run_audit(spark, str(self.trace_dir), str(self.base / "audit"))
        s = result.summary
        assert self.publisher is not None
        return ChaosResult(
            scenario=self.name,
            published=len(self.publisher.confirmed),
            lost=s["lost"],
            duplicated=s["duplicated"],
            unexpected=s["unexpected"],
            completed_once=s["completed_once"],
            recover_s=self.recover_s(),
            elapsed_s=round(time.monotonic() - self.started, 1),
            summary=s,
        )
