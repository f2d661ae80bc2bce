"""``beetle audit`` end to end on generated traces whose verdict is known in advance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from benchmarks.gen_trace import Plan, generate
from celery_beetle.cli import main

pytestmark = pytest.mark.spark
COUNTS = ("messages", "completed_once", "lost", "duplicated", "unexpected", "dead_lettered")


@pytest.fixture
def shared_spark(spark: Any) -> Any:
    """The CLI joins the test session (getOrCreate); put back what its builder changes."""
    yield spark
    spark.conf.set("spark.sql.shuffle.partitions", "2")


def _run(trace: Path, out: Path) -> Any:
    return CliRunner().invoke(main, ["audit", str(trace), "--out", str(out), "--quiet"])


def test_audit_finds_exactly_the_planted_faults_and_exits_1(shared_spark, tmp_path):
    plan = Plan(
        messages=400,
        lost=3,
        duplicated=2,
        overlapped=2,
        unexpected=1,
        dead_lettered=4,
        expired=2,
        retried=20,
        unobserved=2,
        malformed=5,
        skew_ms=300,
        procs=1,
        files_per_proc=4,
    )
    expected = generate(plan, tmp_path / "trace")
    result = _run(tmp_path / "trace", tmp_path / "out")
    assert result.exit_code == 1, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for key in (*COUNTS, "expired", "malformed_lines", "retried_messages", "completed_unobserved"):
        assert summary[key] == expected[key], key
    assert len(summary["samples"]["lost"]) == 3
    assert json.loads(result.output.strip().splitlines()[-1])["lost"] == 3
    assert (tmp_path / "out" / "report.html").stat().st_size > 10_000


def test_clean_trace_exits_0(shared_spark, tmp_path):
    plan = Plan(messages=200, retried=10, dead_lettered=2, expired=1, procs=1, files_per_proc=3)
    expected = generate(plan, tmp_path / "trace")
    result = _run(tmp_path / "trace", tmp_path / "out")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {k: summary[k] for k in COUNTS} == {k: expected[k] for k in COUNTS}
    assert summary["ok"] is True


def test_a_missing_trace_path_is_a_usage_error_naming_it_before_spark_starts(tmp_path):
    result = _run(tmp_path / "nowhere", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert "nowhere: no such file" in result.output


@pytest.mark.parametrize(
    "content", ['garbage\n{"no": "event"}\n', ""], ids=["garbage", "no-messages"]
)
def test_a_trace_without_one_valid_event_exits_3_not_clean(shared_spark, tmp_path, content):
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "h-1-worker-0-000.jsonl").write_text(content)
    result = _run(tmp_path / "trace", tmp_path / "out")
    assert result.exit_code == 3, result.output
    assert "no valid trace event" in result.output
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["ok"] is False


def test_help_is_fast_because_pyspark_is_imported_only_by_audit():
    code = "import sys, celery_beetle.cli; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    help_text = CliRunner().invoke(main, ["--help"]).output
    assert "audit" in help_text


def test_a_local_audit_prints_its_answer_without_sparks_start_up_noise(tmp_path):
    """A new JVM (a subprocess, as a user runs it): nothing on stderr that reads as an error."""
    generate(Plan(messages=50, procs=1, files_per_proc=1), tmp_path / "trace")
    out = subprocess.run(
        [sys.executable, "-m", "celery_beetle.cli", "audit", str(tmp_path / "trace"),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["messages"] == 50
    for noise in ("WARN", "incubator", "log4j", "SPARK_LOCAL_IP"):
        assert noise not in out.stderr, out.stderr
