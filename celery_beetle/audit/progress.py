"""Live progress of the audit's Spark jobs: tasks done in the running stages, and time left.

Spark reports progress per stage (a stage is one pass over a set of partitions; the audit's
long one reads and groups the input). :class:`StageWatcher` polls Spark's status tracker on
a daemon thread and hands each change to a callback as a :class:`StageProgress`; the CLI
shows it beside the step's name. The estimate is the rate so far carried to the end of the
running stages, so it is rough in a stage's first seconds and good from a tenth of the way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["StageProgress", "StageWatcher", "eta_s", "format_progress"]


@dataclass(frozen=True)
class StageProgress:
    """Tasks of the running stages: ``done`` of ``total``, ``eta_s`` seconds left (or None)."""

    stage_ids: tuple[int, ...]
    done: int
    total: int
    elapsed_s: float
    eta_s: float | None


def eta_s(elapsed_s: float, done: int, total: int) -> float | None:
    """Seconds left at the rate so far; None until a task has finished."""
    if done <= 0 or total <= done:
        return None if done <= 0 else 0.0
    return elapsed_s * (total - done) / done


def format_progress(step: str, p: StageProgress | None) -> str:
    """``"reading … · stage 0 · 37/96 tasks · about 41 s left"`` for a status line."""
    if p is None or not p.total:
        return step
    stages = ",".join(str(i) for i in p.stage_ids)
    left = "" if p.eta_s is None else f" · about {_duration(p.eta_s)} left"
    return f"{step} · stage {stages} · {p.done}/{p.total} tasks{left}"


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s} s" if s < 120 else f"{s // 60} min {s % 60:02d} s"


class _Tracker(Protocol):
    """The part of ``pyspark.StatusTracker`` the watcher uses."""

    def getActiveStageIds(self) -> list[int]: ...
    def getStageInfo(self, stageId: int) -> Any: ...


class StageWatcher:
    """Polls ``tracker`` every ``interval_s`` and calls ``report`` while stages run.

    Use as a context manager around the Spark work. ``clock`` is injectable so the timing
    logic is tested without sleeping (:meth:`poll` runs one round on the caller's thread).
    """

    def __init__(
        self,
        tracker: _Tracker,
        report: Callable[[StageProgress], None],
        *,
        interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tracker, self.report = tracker, report
        self.interval_s, self.clock = interval_s, clock
        self._seen: dict[int, float] = {}  # stage id -> when first seen running
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> StageProgress | None:
        """One round: read the running stages and report them; None when none is running."""
        now = self.clock()
        done = total = 0
        ids = tuple(sorted(self.tracker.getActiveStageIds()))
        for stage_id in ids:
            info = self.tracker.getStageInfo(stage_id)
            if info is None:
                continue
            self._seen.setdefault(stage_id, now)
            done += info.numCompletedTasks
            total += info.numTasks
        if not ids:
            return None
        elapsed = now - min(self._seen[i] for i in ids if i in self._seen)
        progress = StageProgress(ids, done, total, elapsed, eta_s(elapsed, done, total))
        self.report(progress)
        return progress

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def __enter__(self) -> StageWatcher:
        self._thread = threading.Thread(target=self._run, name="audit-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s + 1)
