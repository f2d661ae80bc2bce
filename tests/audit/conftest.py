"""Hand-built traces for the audit tests; the Spark session is the root conftest's ``spark``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


class TraceBuilder:
    """Hand-written trace lines with readable defaults; ``ts`` is in seconds for brevity."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def ev(self, event: str, mid: str, ts: float, queue: str = "q", **fields: Any) -> TraceBuilder:
        rec: dict[str, Any] = {
            "ts_ms": int(ts * 1000),
            "event": event,
            "message_id": mid,
            "queue": queue,
            "task_name": fields.pop("task_name", "t.add"),
            "task_id": mid,
            "broker": fields.pop("broker", "a:5672"),
            "worker": fields.pop("worker", "w1"),
            "pid": fields.pop("pid", 1),
            "attempt": fields.pop("attempt", None),
            "detail": fields.pop("detail", None),
        }
        assert not fields, fields
        self.lines.append(json.dumps(rec))
        return self

    def published(
        self, mid: str, ts: float, brokers: tuple[str, ...] = ("a:5672",), **kw: Any
    ) -> TraceBuilder:
        detail = {
            "confirmed": kw.pop("confirmed", True),
            "redundant": len(brokers) > 1,
            "copies": len(brokers),
        }
        for b in brokers:
            self.ev("published", mid, ts, broker=b, detail=detail, worker=None, **kw)
        return self

    def run(
        self,
        mid: str,
        start: float,
        end: float,
        outcome: str = "completed",
        attempt: int = 1,
        worker: str = "w1",
        pid: int = 1,
        **kw: Any,
    ) -> TraceBuilder:
        self.ev("delivered", mid, start - 0.01, worker=worker, pid=pid, **kw)
        self.ev("started", mid, start, attempt=attempt, worker=worker, pid=pid, **kw)
        self.ev(outcome, mid, end, attempt=attempt, worker=worker, pid=pid, **kw)
        return self

    def raw(self, line: str) -> TraceBuilder:
        self.lines.append(line)
        return self

    def write(self, directory: Path, name: str = "host-1-worker-0-000.jsonl") -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_text("\n".join(self.lines) + "\n")
        return path


@pytest.fixture
def trace() -> TraceBuilder:
    return TraceBuilder()
