"""The audit's verdict in one Python process, for small traces: no Spark, no JVM.

The same classification as :func:`celery_beetle.audit.transforms.classify` (same verdicts, in
the same order, same overlap rule), with every message held in a dict. That makes it the
right tool for a test's trace (a few hundred messages: milliseconds, where a Spark session
costs seconds) and the wrong one for a fleet's (memory grows with the number of messages
and speed is one core's ``json.loads``); ``beetle audit`` stays the tool for those.
tests/audit/test_naive_matches_spark.py checks that both reach the same verdicts.

It is also the benchmarks' baseline (``benchmarks/bench_audit.py``), so the per-message
state uses ``__slots__``: that keeps the baseline honest about its memory.

Usage: ``python -m celery_beetle.audit.naive TRACE_DIR_OR_FILES...`` prints the counts as
JSON and exits 1 when a message was lost, duplicated or unexpected.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from celery_beetle.audit.verdicts import BAD_VERDICTS, SUMMARY_COUNTS
from kombu_beetle.trace import EVENTS as TRACE_EVENTS

__all__ = ["Verdict", "audit", "expand", "judge", "main"]

#: Two runs overlapping by more than this are a duplicate (the Spark audit's default).
TOLERANCE_MS = 1000
REQUIRED = {"ts_ms": int, "event": str, "message_id": str, "queue": str}
INTS = ("pid", "attempt")
EVENTS = frozenset(TRACE_EVENTS)
#: ``detail.status`` of a ``duplicate`` when the store said "completed" ("c": its own code)
DONE_STATUS = ("completed", "c")

Run = tuple[str, int, Any, Any, Any]
"""(event, ts_ms, attempt, worker, pid) of a ``started``/``completed``/``failed`` event."""


class Msg:
    """What the verdict needs to know about one ``(queue, message_id)``."""

    __slots__ = (
        "aside",
        "confirmed",
        "counts",
        "last_dead_lettered",
        "last_replayed",
        "runs",
        "seen",
    )

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.confirmed = False
        self.aside = False  # the outbox relay set it aside with a reason
        self.seen = False  # a ``duplicate`` event said the store holds "completed"
        self.last_replayed: int | None = None
        self.last_dead_lettered: int | None = None
        self.runs: list[Run] = []


@dataclass
class Verdict:
    """Counts per verdict (``summary.json``'s keys) and the ids of every bad message."""

    counts: dict[str, int]
    #: ``queue/message_id`` of every message per bad verdict (lost, duplicated, unexpected)
    ids: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.counts["messages"]) and not any(self.counts[v] for v in BAD_VERDICTS)

    def __str__(self) -> str:
        shown = {k: v for k, v in self.counts.items() if v}
        bad = {v: ids for v, ids in self.ids.items() if ids}
        return f"{shown}" + (f"; {bad}" if bad else "")


def _valid(rec: Any) -> bool:
    if not isinstance(rec, dict):
        return False
    for key, typ in REQUIRED.items():
        v = rec.get(key)
        if not isinstance(v, typ) or isinstance(v, bool):
            return False
    if rec["event"] not in EVENTS:
        return False
    if rec.get("detail") is not None and not isinstance(rec["detail"], dict):
        return False
    return all(rec.get(k) is None or type(rec.get(k)) is int for k in INTS)


def _overlap(runs: list[Run]) -> bool:
    """Two runs overlapping by more than the tolerance; an unfinished run is a point."""
    starts = [r for r in runs if r[0] == "started"]
    if len(starts) < 2:
        return False
    spans = []
    for _, ts, attempt, worker, pid in starts:
        ends = [r[1] for r in runs if r[0] != "started" and r[2:] == (attempt, worker, pid)]
        spans.append((ts, max(min(ends), ts) if ends else ts))
    for i, (s1, e1) in enumerate(spans):
        for s2, e2 in spans[i + 1 :]:
            if min(e1, e2) - max(s1, s2) > TOLERANCE_MS:
                return True
    return False


def _unobserved(m: Msg) -> bool:
    return not m.counts.get("completed") and m.seen


def verdict(m: Msg) -> str:
    """One verdict, checked in :data:`~celery_beetle.audit.verdicts.VERDICTS` order."""
    c = m.counts.get
    done = c("completed", 0)
    replayed = c("replayed", 0) > 0
    completed = done == 1 or _unobserved(m)
    if done and not c("published", 0) and not c("enqueued", 0) and not replayed:
        return "unexpected"
    if done > 1 or _overlap(m.runs):
        return "duplicated"
    if replayed and completed:
        return "replayed"
    if completed:
        return "completed_once"
    if replayed and (
        m.last_dead_lettered is None
        or (m.last_replayed is not None and m.last_dead_lettered < m.last_replayed)
    ):
        return "lost"  # a replay's run that never ended
    if c("dead_lettered", 0):
        return "dead_lettered"
    if c("expired", 0):
        return "expired"
    if c("failed", 0) > c("retried", 0):
        return "failed"
    if m.aside and not c("published", 0):
        return "set_aside"
    if c("enqueued", 0) and not c("published", 0):
        return "never_relayed"
    if m.confirmed:
        return "lost"
    return "unconfirmed" if c("published", 0) else "untracked"


def _read(paths: Iterable[str], msgs: dict[tuple[str, str], Msg]) -> int:
    """Fold every line of ``paths`` into ``msgs``; returns the number of malformed lines."""
    malformed = 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    malformed += 1
                    continue
                if not _valid(rec):
                    malformed += 1
                    continue
                key = (rec["queue"], rec["message_id"])
                m = msgs.get(key)
                if m is None:
                    m = msgs[key] = Msg()
                ev = rec["event"]
                m.counts[ev] = m.counts.get(ev, 0) + 1
                detail = rec.get("detail") or {}
                ts = rec["ts_ms"]
                if ev == "published" and detail.get("confirmed") is True:
                    m.confirmed = True
                elif ev == "duplicate" and detail.get("status") in DONE_STATUS:
                    m.seen = True
                elif ev == "relayed" and detail.get("aside") is not None:
                    m.aside = True
                elif ev in ("started", "completed", "failed"):
                    m.runs.append((ev, ts, rec.get("attempt"), rec.get("worker"), rec.get("pid")))
                elif ev == "replayed":
                    m.last_replayed = max(ts, m.last_replayed or ts)
                elif ev == "dead_lettered":
                    m.last_dead_lettered = max(ts, m.last_dead_lettered or ts)
    return malformed


def judge(paths: Iterable[str]) -> Verdict:
    """The verdict on the trace files ``paths`` (see :func:`expand` for directories)."""
    msgs: dict[tuple[str, str], Msg] = {}
    malformed = _read(paths, msgs)
    out = dict.fromkeys(SUMMARY_COUNTS, 0)
    out["messages"] = len(msgs)
    out["malformed_lines"] = malformed
    ids: dict[str, list[str]] = {v: [] for v in BAD_VERDICTS}
    for (queue, message_id), m in msgs.items():
        v = verdict(m)
        out[v] += 1
        if v in ids:
            ids[v].append(f"{queue}/{message_id}")
        if _unobserved(m):
            out["completed_unobserved"] += 1
        r = m.counts.get("retried", 0)
        if r:
            out["retried_messages"] += 1
            out["retries"] += r
    return Verdict(out, {v: sorted(found) for v, found in ids.items()})


def audit(paths: list[str]) -> dict[str, int]:
    """The counts alone, as ``summary.json`` holds them (the benchmarks' baseline)."""
    return judge(paths).counts


def expand(args: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Trace files from directories (their files, not hidden ones), globs and file names."""
    files: list[str] = []
    for arg in args:
        a = os.fspath(arg)
        if os.path.isdir(a):
            files += sorted(
                os.path.join(a, n) for n in os.listdir(a) if not n.startswith((".", "_"))
            )
        else:
            files += sorted(glob.glob(a)) or [a]
    return files


def main(argv: list[str] | None = None) -> int:
    result = judge(expand(sys.argv[1:] if argv is None else argv))
    print(json.dumps(result.counts))
    return 0 if not any(result.counts[v] for v in BAD_VERDICTS) else 1


if __name__ == "__main__":
    sys.exit(main())
