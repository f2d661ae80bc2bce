"""Run a Celery worker of ``tests.integration.celery_app`` in a subprocess."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from celery_beetle.testing.worker import WorkerProcess

#: the repository: the workers run its test apps
ROOT = Path(__file__).resolve().parents[1]


class Worker(WorkerProcess):
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
        env = {
            "BEETLE_TEST_URL": url,
            "BEETLE_TEST_OUT": str(out),
            "BEETLE_TEST_OPTIONS": json.dumps(options or {}),
            "BEETLE_TEST_QUEUE": queue,
            **(extra_env or {}),
        }
        super().__init__(
            "tests.integration.celery_app",
            out.with_suffix(".log"),
            env,
            pool=pool,
            concurrency=concurrency,
            queue=queue,
            name="it",
            extra_args=extra_args,
        )

    def start(self, ready_timeout: float = 45) -> Worker:
        self.out.touch()
        super().start(ready_timeout)
        return self

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
