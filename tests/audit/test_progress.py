"""The audit's progress line: stage tasks and time left, from a fake status tracker and clock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_beetle.audit.progress import StageProgress, StageWatcher, eta_s, format_progress


class FakeTracker:
    """Spark's status tracker as a dict of stage id -> (completed tasks, tasks)."""

    def __init__(self) -> None:
        self.stages: dict[int, tuple[int, int]] = {}

    def getActiveStageIds(self) -> list[int]:
        return list(self.stages)

    def getStageInfo(self, stageId: int) -> Any:
        done, total = self.stages[stageId]
        return SimpleNamespace(numCompletedTasks=done, numTasks=total)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_time_left_is_the_rate_so_far_carried_to_the_last_task():
    assert eta_s(10.0, 25, 100) == pytest.approx(30.0)
    assert eta_s(10.0, 0, 100) is None
    assert eta_s(10.0, 100, 100) == 0.0


def test_watcher_reports_tasks_and_time_left_from_when_the_stage_was_first_seen():
    tracker, clock, seen = FakeTracker(), Clock(), []
    watcher = StageWatcher(tracker, seen.append, clock=clock)
    assert watcher.poll() is None and not seen  # nothing running, nothing shown
    tracker.stages[3] = (0, 40)
    first = watcher.poll()
    assert first is not None and first.eta_s is None
    clock.now += 20
    tracker.stages[3] = (10, 40)
    later = watcher.poll()
    assert later == StageProgress((3,), 10, 40, 20.0, 60.0)
    assert seen == [first, later]


def test_progress_line_names_the_step_the_stage_and_the_time_left():
    line = format_progress("reading trace", StageProgress((0,), 37, 96, 20.0, 150.0))
    assert line == "reading trace · stage 0 · 37/96 tasks · about 2 min 30 s left"
    assert format_progress("summarising", None) == "summarising"
