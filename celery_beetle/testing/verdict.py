"""Judging a test's trace: did every message run exactly once?

The evidence is the trace both ends wrote (:mod:`kombu_beetle.trace`), judged by the naive
checker (:mod:`celery_beetle.audit.naive`: the Spark audit's verdicts, without a JVM), never
the tasks' own return values: a task that ran twice returns twice as happily as once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from celery_beetle.audit import naive
from celery_beetle.audit.naive import Verdict
from kombu_beetle.trace import flush_all

__all__ = ["ExactlyOnceError", "assert_exactly_once", "judge_trace", "wait_for_outcomes"]

#: verdicts of a message that ran exactly once (a replayed dead letter counts: it ran once)
ONCE = ("completed_once", "replayed")


class ExactlyOnceError(AssertionError):
    """A message was lost, run twice or run unpublished; ``verdict`` holds the counts and ids."""

    def __init__(self, message: str, verdict: Verdict) -> None:
        super().__init__(message)
        self.verdict = verdict


def judge_trace(trace_dir: str | os.PathLike[str]) -> Verdict:
    """The verdict on everything under ``trace_dir`` now (this process's buffers flushed)."""
    flush_all()
    directory = Path(trace_dir)
    if not directory.is_dir():
        return naive.judge([])
    return naive.judge(naive.expand([directory]))


def wait_for_outcomes(
    trace_dir: str | os.PathLike[str], timeout: float = 60, interval: float = 0.25
) -> Verdict:
    """Poll until no confirmed message is still waiting for an outcome (none reads "lost"),
    or ``timeout`` passes; return the last verdict either way."""
    deadline = time.monotonic() + timeout
    while True:
        verdict = judge_trace(trace_dir)
        if verdict.counts["messages"] and not verdict.counts["lost"]:
            return verdict
        if time.monotonic() > deadline:
            return verdict
        time.sleep(interval)


def assert_exactly_once(trace_dir: str | os.PathLike[str], expected: int | None = None) -> Verdict:
    """Fail (:class:`ExactlyOnceError`) unless every traced message ran exactly once.

    ``expected``: how many messages the test published and expects run; without it, any
    number above zero. Messages that were dead-lettered, expired or failed for good are not
    "run exactly once", so they fail the assertion too: a test of a task that is meant to
    give up asserts on :func:`judge_trace` instead.
    """
    verdict = judge_trace(trace_dir)
    counts = verdict.counts
    once = sum(counts[v] for v in ONCE)
    problems = []
    if not counts["messages"]:
        problems.append(
            f"the trace under {trace_dir} holds no message: were BeetleTasks published "
            "through the app the fixtures configured (beetle_app / beetle_setup.app)?"
        )
    for name in ("lost", "duplicated", "unexpected"):
        if counts[name]:
            problems.append(f"{counts[name]} {name}: {', '.join(verdict.ids[name])}")
    interrupted = _started(trace_dir, verdict.ids["lost"]) if counts["lost"] else 0
    if interrupted:
        problems.append(
            f"{interrupted} of the lost began a body and have no outcome yet: a run a kill "
            "interrupted runs again only once its lease (the task's `timeout`, 300 s by "
            "default) runs out; give the tasks under test a short `timeout`, or wait longer "
            "(assert_exactly_once(timeout=...))"
        )
    others = {k: counts[k] for k in ("dead_lettered", "expired", "failed") if counts[k]}
    if others:
        problems.append(f"not run to completion: {others}")
    if expected is not None and once != expected:
        problems.append(f"{once} of {expected} expected messages ran exactly once")
    if problems:
        raise ExactlyOnceError(
            "not exactly once: " + "; ".join(problems) + f"\n(verdict: {verdict})", verdict
        )
    return verdict


def _started(trace_dir: str | os.PathLike[str], ids: list[str]) -> int:
    """How many of ``ids`` (``queue/message_id``) have a ``started`` event in the trace."""
    wanted = {i.rpartition("/")[2] for i in ids}
    began: set[str] = set()
    for path in naive.expand([Path(trace_dir)]):
        for line in Path(path).read_text(errors="replace").splitlines():
            if '"started"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "started" and event.get("message_id") in wanted:
                began.add(event["message_id"])
    return len(began)
