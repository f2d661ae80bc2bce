"""The baseline: the same verdict in one Python process, every message held in a dict.

This is what one would write first, and it is correct; it is here to check the Spark audit's
verdict independently and to show what it costs: memory grows with the number of messages
(one dict entry each) and speed is one core's ``json.loads``.

Usage: ``python -m benchmarks.naive_audit TRACE_DIR_OR_FILES...`` prints the verdict as JSON.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any

from celery_beetle.audit.schema import SUMMARY_COUNTS
from kombu_beetle.trace import EVENTS as TRACE_EVENTS

TOLERANCE_MS = 1000
REQUIRED = {"ts_ms": int, "event": str, "message_id": str, "queue": str}
INTS = ("pid", "attempt")
EVENTS = frozenset(TRACE_EVENTS)


class Msg:
    """Per-message state; ``__slots__`` keeps the baseline honest about its memory."""

    __slots__ = ("confirmed", "counts", "runs", "seen_completed")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.confirmed = False
        self.seen_completed = False
        self.runs: list[tuple[str, int, Any, Any, Any]] = []


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


def _overlap(runs: list[tuple[str, int, Any, Any, Any]]) -> bool:
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


def verdict(m: Msg) -> str:
    c = m.counts.get
    done = c("completed", 0)
    if done and not c("published", 0):
        return "unexpected"
    if done > 1 or _overlap(m.runs):
        return "duplicated"
    if done == 1 or m.seen_completed:
        return "completed_once"
    if c("dead_lettered", 0):
        return "dead_lettered"
    if c("expired", 0):
        return "expired"
    if c("failed", 0) > c("retried", 0):
        return "failed"
    if m.confirmed:
        return "lost"
    return "unconfirmed" if c("published", 0) else "untracked"


def audit(paths: list[str]) -> dict[str, int]:
    msgs: dict[tuple[str, str], Msg] = {}
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
                if ev == "published" and detail.get("confirmed") is True:
                    m.confirmed = True
                elif ev == "duplicate" and detail.get("status") in ("completed", "c"):
                    m.seen_completed = True
                elif ev in ("started", "completed", "failed"):
                    m.runs.append(
                        (ev, rec["ts_ms"], rec.get("attempt"), rec.get("worker"), rec.get("pid"))
                    )
    out = dict.fromkeys(SUMMARY_COUNTS, 0)
    out["messages"] = len(msgs)
    out["malformed_lines"] = malformed
    for m in msgs.values():
        v = verdict(m)
        out[v] += 1
        if v == "completed_once" and not m.counts.get("completed"):
            out["completed_unobserved"] += 1
        r = m.counts.get("retried", 0)
        if r:
            out["retried_messages"] += 1
            out["retries"] += r
    return out


def expand(args: list[str]) -> list[str]:
    files: list[str] = []
    for a in args:
        if os.path.isdir(a):
            files += sorted(
                os.path.join(a, n) for n in os.listdir(a) if not n.startswith((".", "_"))
            )
        else:
            files += sorted(glob.glob(a)) or [a]
    return files


def main(argv: list[str] | None = None) -> int:
    result = audit(expand(sys.argv[1:] if argv is None else argv))
    print(json.dumps(result))
    return 1 if result["lost"] or result["duplicated"] or result["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
