"""Replaying a scenario in a test: run it, and fail with its violations and the command
that replays it outside pytest."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_beetle.testing.explorer import checker
from celery_beetle.testing.explorer.cli import replay_command
from celery_beetle.testing.explorer.runner import Cluster, run_scenario
from celery_beetle.testing.explorer.scenario import Scenario, draw
from celery_beetle.testing.explorer.timeline import timeline


def replay(cluster: Cluster, scenario: Scenario | str | int, base: Path) -> None:
    """Run ``scenario`` (a Scenario, its JSON, or a seed to draw) and fail on a violation."""
    if isinstance(scenario, int):
        scenario = draw(scenario)
    elif isinstance(scenario, str):
        scenario = Scenario.from_json(scenario)
    outcome = run_scenario(cluster, scenario, base / f"seed-{scenario.seed}")
    if outcome.failed:
        lines = [f"{v}  <- {checker.finding(v, scenario)}" for v in outcome.violations[:20]]
        # the first violating message's story: readable where the run's files are not
        key = outcome.violations[0].key.rsplit("/", 1)[-1]  # the audit names queue/message
        lines += [f"timeline of {key}:"]
        lines += ["  " + row for row in timeline(outcome.base, key)]
        pytest.fail(
            f"{scenario.describe()}\n"
            + "\n".join(lines)
            + f"\nreplay: {replay_command(scenario.seed)} (files: {outcome.base})",
            pytrace=False,
        )
