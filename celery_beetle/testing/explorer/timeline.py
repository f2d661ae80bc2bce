"""One message's story in a failed run: its trace events, ledger lines and worker-log lines in
time order, so that a failure seen once (in CI, on another machine) can be read without its
files. :func:`timeline` is what a failing seed prints under its violations."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from celery_beetle.audit import naive

__all__ = ["timeline"]

#: Celery's log line prefix: ``[2026-11-24 23:18:23,184: WARNING/MainProcess] ...``
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):")


def timeline(base: Path, key: str, limit: int = 60) -> list[str]:
    """Lines ``<time> <source> <what>`` about ``key`` under a run's directory ``base``."""
    rows: list[tuple[float, str]] = []
    for trace in naive.expand([base / "trace"]):
        rows += _trace_rows(Path(trace), key)
    for ledger in sorted((base / "ledger").glob("*.jsonl")):
        rows += _ledger_rows(ledger, key)
    for log in sorted(base.glob("worker*.log")):
        rows += _log_rows(log, key)
    rows.sort(key=lambda row: row[0])
    return [f"{_clock(ts)} {text}"[:300] for ts, text in rows[:limit]]


def _records(path: Path, key: str) -> Iterator[dict[str, Any]]:
    """The JSON lines of ``path`` that mention ``key`` (torn or foreign lines skipped)."""
    for line in path.read_text(errors="replace").splitlines():
        if key not in line:
            continue
        try:
            yield json.loads(line)
        except ValueError:
            continue


def _trace_rows(path: Path, key: str) -> list[tuple[float, str]]:
    rows = []
    for rec in _records(path, key):
        detail = rec.get("detail") or {}
        rows.append(
            (
                int(rec.get("ts_ms") or 0) / 1000,
                f"trace  pid {rec.get('pid')} {rec.get('event')} broker={rec.get('broker')} "
                f"attempt={rec.get('attempt')} {json.dumps(detail) if detail else ''}",
            )
        )
    return rows


def _ledger_rows(path: Path, key: str) -> list[tuple[float, str]]:
    return [
        (float(rec.get("ts") or 0), f"ledger pid {rec.get('pid')} {rec.get('ev')}")
        for rec in _records(path, key)
    ]


def _log_rows(path: Path, key: str) -> list[tuple[float, str]]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        found = _LOG_TIME.match(line)
        if key not in line or not found:
            continue
        when = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        rows.append((when, f"{path.stem:6} {line[found.end() :].strip()}"))
    return rows


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]
