"""Chaos scenarios: fixtures, and the table of results printed at the end of the run.

CI runs the short version of every scenario (a few hundred messages each); ``--soak`` runs
the long one.  Each scenario is judged by the Spark audit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.run import ChaosResult, ChaosRun

RESULTS: list[ChaosResult] = []


def message_count(config: pytest.Config) -> int:
    return 3000 if config.getoption("--soak") else 240


@pytest.fixture
def messages(request: pytest.FixtureRequest) -> int:
    return message_count(request.config)


@pytest.fixture
def chaos(brokers: Any, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., ChaosRun]]:
    """``chaos(name, redis=None, conf=None, task_options=None)`` -> a ChaosRun (``conf``: more
    app settings, ``task_options``: over the short lease's); its workers are killed after."""
    runs: list[ChaosRun] = []

    def make(name: str, redis: str | None = None, **options: Any) -> ChaosRun:
        run = ChaosRun(name, brokers, redis or redis_url, tmp_path / name, **options)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.kill_all()


def judge(run: ChaosRun, spark: Any) -> ChaosResult:
    """Audit the run, record it for the table, and assert the verdict."""
    run.stop()
    result = run.audit(spark)
    RESULTS.append(result)
    assert run.publisher is not None and run.publisher.errors == []
    bad = {k: v for k, v in result.summary["samples"].items() if v}
    assert (result.lost, result.duplicated, result.unexpected) == (0, 0, 0), bad
    assert result.completed_once == result.published, result.summary
    return result


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("chaos scenarios (judged by beetle audit)")
    write("stall s: the longest time without a completed task after the fault (time to recover)")
    columns = ("messages", "lost", "dup", "unexp", "stall s", "run s")
    write(f"{'scenario':<34} " + " ".join(f"{c:>9}" for c in columns))
    for r in RESULTS:
        write(
            f"{r.scenario:<34} "
            + " ".join(
                f"{v:>9}"
                for v in (r.published, r.lost, r.duplicated, r.unexpected, r.recover_s, r.elapsed_s)
            )
        )
