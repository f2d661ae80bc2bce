"""Shrinking: a smaller scenario that still fails the same way, written as a regression test.

Each step proposes a smaller scenario and runs it; it is kept when it still breaks one of
the rules the original broke (same rule name: the same kind of bug, not necessarily the same
message). Steps, in order, each tried once within a budget of runs (a run costs 20-60 s on
real servers, so shrinking is greedy, not exhaustive like Hypothesis'):

1. fewer messages: those of the first three violations of each rule, plus every other one
   of the rest;
2. fewer faults: the last fault dropped (one at a time, while more than one is left);
3. fewer workers and brokers: one worker less, two brokers.

Timing matters to most failures here (a kill while a pool holds claims), so a step that
stops failing may only have been unlucky; the shrunk scenario is a regression test to
replay, not a proof of the smallest cause.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from celery_beetle.testing.explorer.scenario import Scenario

if TYPE_CHECKING:
    from celery_beetle.testing.explorer.runner import Cluster, Outcome

__all__ = ["candidates", "regression_test_source", "shrink", "write_test"]

_KEY = re.compile(r"^s\d+-(\d+)-[0-9a-f]+")


def _violating_indexes(outcome: Outcome, per_rule: int = 3) -> set[int]:
    """The items of the first few violations of each rule (the messages to keep)."""
    out: set[int] = set()
    seen: dict[str, int] = {}
    for v in outcome.violations:
        # ``s<seed>-<index>-<nonce>``, with a suffix for a chain's second task, a group's
        # member or a retry (``c``, ``g1``, ``:retry-1``)
        found = _KEY.match(v.key)
        if found and seen.get(v.rule, 0) < per_rule:
            seen[v.rule] = seen.get(v.rule, 0) + 1
            out.add(int(found.group(1)))
    return out


def candidates(scenario: Scenario, keep: set[int]) -> Iterator[Scenario]:
    """Smaller scenarios, most promising first (see the module docstring)."""
    items = tuple(item for n, item in enumerate(scenario.items) if item.index in keep or n % 2 == 0)
    if len(items) < len(scenario.items):
        yield scenario.but(items=items)
    faults = scenario.faults
    while len(faults) > 1:
        faults = faults[:-1]
        yield scenario.but(faults=faults)
    s = scenario.settings
    if s.workers > 1 or s.brokers > 2:
        yield scenario.but(settings=replace(s, workers=max(1, s.workers - 1), brokers=2))


def shrink(cluster: Cluster, outcome: Outcome, base: Path, budget: int = 4) -> Scenario:
    """The smallest failing scenario found within ``budget`` runs (the original if none)."""
    from celery_beetle.testing.explorer.runner import run_scenario

    best, rules = outcome.scenario, {v.rule for v in outcome.violations}
    keep = _violating_indexes(outcome)
    runs = 0
    progress = True
    while progress and runs < budget:
        progress = False
        for candidate in candidates(best, keep):
            if runs >= budget:
                break
            runs += 1
            tried = run_scenario(cluster, candidate, base / f"try-{runs}")
            if rules & {v.rule for v in tried.violations}:
                best, keep, progress = candidate, _violating_indexes(tried), True
                break
    return best


def regression_test_source(scenario: Scenario, rules: list[str]) -> str:
    """A pytest module that replays ``scenario`` and fails on any violation."""
    name = f"test_seed_{scenario.seed}_replays_without_a_violation"
    return f'''"""Regression test written by the fault explorer (shrunk from
scripts/explore --seed {scenario.seed}): it broke
{", ".join(sorted(rules))}. Replays the shrunk scenario on real servers."""

from __future__ import annotations

import pytest

from tests.explorer.replay import replay

SEED = {scenario.seed}
SCENARIO = """
{scenario.to_json(indent=1)}
"""


@pytest.mark.explorer
def {name}(explorer_cluster, tmp_path):
    replay(explorer_cluster, SCENARIO, tmp_path)
'''


def write_test(scenario: Scenario, directory: Path, rules: list[str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"test_seed_{scenario.seed}.py"
    path.write_text(regression_test_source(scenario, rules or []))
    return path
