"""The effect ledger: what task bodies really did, written by the bodies themselves.

The trace says what the worker *decided*; the ledger says what the body *did*. Each body
appends JSON lines to a file of its own process (``ledger-<pid>.jsonl``, opened with
``O_APPEND`` and written with one ``write`` per line, so a SIGKILL leaves whole lines):
``start`` when the body begins, ``committed`` when an inbox body's transaction committed,
``end`` when it returns, ``fail`` when it raises, ``retry`` before it calls ``self.retry``
(not an end: the retry's publish may still fail); a body in a worker with tracing off marks
each line ``untraced``. The checker counts starts per message
against ``attempts`` ("how many times a message may start") and asks, for every dead letter,
whether the bodies it blames ever began.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Entry", "Ledger", "note", "read", "read_dir"]

EVENTS = ("start", "committed", "end", "fail", "retry")


def note(directory: str, event: str, key: str, **fields: object) -> None:
    """Append one line for ``key`` (the message's task id) to this process's file."""
    line = {"ev": event, "key": key, "pid": os.getpid(), "ts": time.time(), **fields}
    path = os.path.join(directory, f"ledger-{os.getpid()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@dataclass
class Entry:
    """Everything the ledger holds about one message."""

    starts: list[tuple[float, int]] = field(default_factory=list)  # (ts, pid)
    ends: list[tuple[float, int]] = field(default_factory=list)
    fails: int = 0
    committed: list[tuple[float, int]] = field(default_factory=list)
    retried: list[tuple[float, int]] = field(default_factory=list)


class Ledger(dict[str, Entry]):
    """``key -> Entry``; :attr:`malformed` counts lines that did not parse (a torn write),
    :attr:`untraced_pids` the processes of workers with tracing off (lines marked
    ``untraced``)."""

    malformed: int = 0

    def __init__(self, entries: dict[str, Entry] | None = None) -> None:
        super().__init__(entries or {})
        self.untraced_pids: set[int] = set()

    def entry(self, key: str) -> Entry:
        return self.get(key) or Entry()


def read(paths: Iterable[Path]) -> Ledger:
    ledger = Ledger()
    for path in paths:
        for line in Path(path).read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                event, key, ts, pid = rec["ev"], str(rec["key"]), float(rec["ts"]), int(rec["pid"])
            except (ValueError, KeyError, TypeError):
                ledger.malformed += 1
                continue
            if rec.get("untraced"):
                ledger.untraced_pids.add(pid)
            e = ledger.setdefault(key, Entry())
            if event == "start":
                e.starts.append((ts, pid))
            elif event == "end":
                e.ends.append((ts, pid))
            elif event == "committed":
                e.committed.append((ts, pid))
            elif event == "retry":
                e.retried.append((ts, pid))
            elif event == "fail":
                e.fails += 1
            else:
                ledger.malformed += 1
    return ledger


def read_dir(directory: Path | str) -> Ledger:
    return read(sorted(Path(directory).glob("ledger-*.jsonl")))
