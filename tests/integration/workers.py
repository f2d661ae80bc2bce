"""Run a Celery worker of ``tests.integration.celery_app`` in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """A worker process whose task runs are counted from its output file."""

    def __init__(
        self,
        url: str,
        out: Path,
        *,
        options: dict[str, Any] | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        queue: str = "celery",
        extra_env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.out = out
        self.log = out.with_suffix(".log")
        env = dict(os.environ)
        env.update(
            {
                "BEETLE_TEST_URL": url,
                "BEETLE_TEST_OUT": str(out),
                "BEETLE_TEST_OPTIONS": json.dumps(options or {}),
                "BEETLE_TEST_QUEUE": queue,
                "PYTHONPATH": f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}",
            }
        )
        env.update(extra_env or {})
        self.env = env
        self.args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.celery_app",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            queue,
            "--without-gossip",
            "--without-mingle",
            "-l",
            "info",
            "-n",
            f"it-{os.getpid()}-{time.monotonic_ns()}@%h",
            *extra_args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 30) -> Worker:
        self.out.touch()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
            )
        deadline = time.monotonic() + ready_timeout
        while b" ready." not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log_text()[-3000:]}")
            time.sleep(0.1)
        return self

    def log_text(self) -> str:
        return self.log.read_bytes().decode(errors="replace")

    def runs(self) -> list[tuple[int, str]]:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        return [(int(item), broker) for item, broker, _ in (line.split() for line in lines)]

    def run_counts(self) -> Counter[int]:
        return Counter(item for item, _ in self.runs())

    def wait_for(self, items: set[int], timeout: float = 60) -> set[int]:
        """Wait until every item ran at least once; return the ones still missing."""
        deadline = time.monotonic() + timeout
        missing = set(items)
        while missing and time.monotonic() < deadline:
            missing = items - set(self.run_counts())
            if missing:
                time.sleep(0.2)
        return missing

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
