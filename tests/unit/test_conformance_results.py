"""The conformance run's reading of pytest's JUnit XML and its comparison of two runs."""

from __future__ import annotations

from pathlib import Path

from celery_beetle.testing.conformance.results import Outcome, compare, read_junit

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="t.integration.test_tasks.test_tasks" name="test_simple_call" />
<testcase classname="t.integration.test_tasks.test_tasks" name="test_expired">
  <failure message="Timeout">...</failure></testcase>
<testcase classname="t.integration.test_tasks.test_tasks" name="test_setup_error">
  <error message="fixture">...</error></testcase>
<testcase classname="t.integration.test_canvas.test_chord" name="test_redis">
  <skipped type="pytest.skip" message="needs redis" /></testcase>
<testcase classname="t.integration.test_canvas.test_chord" name="test_known_bug">
  <skipped type="pytest.xfail" message="known" /></testcase>
<testcase classname="t.integration.test_canvas.test_chord" name="test_subtests" />
<testcase classname="t.integration.test_canvas.test_chord" name="test_subtests">
  <failure message="subtest">...</failure></testcase>
<testcase classname="t.integration.test_canvas.test_chord" name="test_subtests" />
</testsuite></testsuites>
"""


def test_each_case_is_named_by_module_class_and_test_with_its_outcome(tmp_path: Path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    assert read_junit(path) == {
        "test_tasks::test_tasks::test_simple_call": Outcome.PASSED,
        "test_tasks::test_tasks::test_expired": Outcome.FAILED,
        "test_tasks::test_tasks::test_setup_error": Outcome.FAILED,
        "test_canvas::test_chord::test_redis": Outcome.SKIPPED,
        "test_canvas::test_chord::test_known_bug": Outcome.XFAILED,
        "test_canvas::test_chord::test_subtests": Outcome.FAILED,  # one subtest failed
    }


def test_a_comparison_sorts_each_test_by_where_it_failed():
    P, F, S = Outcome.PASSED, Outcome.FAILED, Outcome.SKIPPED
    baseline = {"a": P, "b": P, "c": F, "d": F, "e": S, "f": P}
    beetle = {"a": P, "b": F, "c": P, "d": F, "e": S, "g": P}
    result = compare("suite", baseline, beetle)
    assert result.passed_both == ["a"]
    assert result.failed_only_beetle == ["b"]
    assert result.failed_only_baseline == ["c"]
    assert result.failed_both == ["d"]
    assert result.not_run == ["f", "g"]  # "e" was skipped under both: in no list
    assert "  failed only under beetle: 1" in result.lines()
