"""Each test's outcome from pytest's JUnit XML, and two runs of one suite side by side."""

from __future__ import annotations

import enum
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Comparison", "Outcome", "compare", "read_junit"]


class Outcome(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    XFAILED = "xfailed"

    @property
    def ok(self) -> bool:
        """Counts as conforming: passed, or skipped/xfailed as the suite itself decided."""
        return self is not Outcome.FAILED


#: which of a test's reports decides its outcome: a failure, else a pass, ...
RANK = {Outcome.SKIPPED: 0, Outcome.XFAILED: 1, Outcome.PASSED: 2, Outcome.FAILED: 3}


def read_junit(path: Path) -> dict[str, Outcome]:
    """``{"test_tasks::test_tasks::test_expired": outcome}`` for every test in ``path``.

    A test with subtests has a case per report: it failed if any of them did.
    """
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").removeprefix("t.integration.")
        test = f"{module.replace('.', '::')}::{case.get('name')}"
        outcome, before = _outcome(case), outcomes.get(test)
        if before is None or RANK[outcome] > RANK[before]:
            outcomes[test] = outcome
    return outcomes


def _outcome(case: ET.Element) -> Outcome:
    if case.find("failure") is not None or case.find("error") is not None:
        return Outcome.FAILED
    skipped = case.find("skipped")
    if skipped is None:
        return Outcome.PASSED
    return Outcome.XFAILED if skipped.get("type") == "pytest.xfail" else Outcome.SKIPPED


@dataclass
class Comparison:
    """One suite under the baseline (``pyamqp``) and under ``beetle``, test by test."""

    suite: str
    baseline: Mapping[str, Outcome]
    beetle: Mapping[str, Outcome]
    passed_both: list[str] = field(default_factory=list)
    failed_only_beetle: list[str] = field(default_factory=list)
    failed_only_baseline: list[str] = field(default_factory=list)
    failed_both: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)

    def counts(self, outcomes: Mapping[str, Outcome]) -> dict[Outcome, int]:
        return {o: sum(1 for v in outcomes.values() if v is o) for o in Outcome}

    def lines(self) -> list[str]:
        out = [f"== {self.suite}"]
        for name, outcomes in (("pyamqp", self.baseline), ("beetle", self.beetle)):
            counts = self.counts(outcomes)
            out.append(f"  {name:7} " + ", ".join(f"{n} {o.value}" for o, n in counts.items()))
        out.append(f"  passed under both: {len(self.passed_both)}")
        for title, tests in (
            ("failed only under beetle", self.failed_only_beetle),
            ("failed only under pyamqp", self.failed_only_baseline),
            ("failed under both", self.failed_both),
            ("ran under one transport only", self.not_run),
        ):
            out.append(f"  {title}: {len(tests)}")
            out.extend(f"    {test}" for test in tests)
        return out


def compare(
    suite: str, baseline: Mapping[str, Outcome], beetle: Mapping[str, Outcome]
) -> Comparison:
    result = Comparison(suite, baseline, beetle)
    for test in sorted(set(baseline) | set(beetle)):
        a, b = baseline.get(test), beetle.get(test)
        if a is None or b is None:
            result.not_run.append(test)
        elif a is Outcome.PASSED and b is Outcome.PASSED:
            result.passed_both.append(test)
        elif a.ok and b.ok:
            continue  # skipped or xfailed under one of them, as the suite decided
        elif a.ok:
            result.failed_only_beetle.append(test)
        elif b.ok:
            result.failed_only_baseline.append(test)
        else:
            result.failed_both.append(test)
    return result
