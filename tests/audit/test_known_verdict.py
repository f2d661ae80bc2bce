"""A generated trace whose whole summary was recorded before the audit's performance work.

``data/known_verdict_summary.json`` is what the audit of commit 41c20ce (before the single
cached pass, #14) wrote for this trace: counts, latency percentiles, broker tables, redundancy
and samples. Any later change to how the audit computes must reproduce it exactly; a change
that means to alter a verdict must re-record the file and say why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gen_trace import Plan, generate

pytestmark = pytest.mark.spark

KNOWN = Path(__file__).parent / "data" / "known_verdict_summary.json"
#: Fields that describe the run rather than the trace.
RUN_FIELDS = ("trace_path", "timings_s", "elapsed_s")
#: Latencies are ``percentile_approx`` figures: merged from partial sketches, so how the rows
#: are partitioned moves a tail percentile to a neighbouring value (p99 of ~590 values).
LATENCY_FIELDS = ("latency_ms", "latency_by_task")
#: Added after the summary was recorded (pictures, not verdicts), checked by their own tests.
NEWER_FIELDS = ("timeline",)


def _plan() -> Plan:
    return Plan(
        messages=600,
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
        seed=11,
    )


def _comparable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without run facts or latencies, with row order normalised."""
    out = {
        k: v for k, v in summary.items() if k not in (*RUN_FIELDS, *LATENCY_FIELDS, *NEWER_FIELDS)
    }
    out["brokers"] = sorted(out["brokers"], key=lambda r: r["broker"])
    out["samples"] = {k: sorted(v) for k, v in out["samples"].items()}
    return out


def test_a_trace_with_a_known_verdict_gives_the_recorded_summary(spark, tmp_path):
    from celery_beetle.audit import job

    generate(_plan(), tmp_path / "trace")
    result = job.run_audit(spark, str(tmp_path / "trace"), str(tmp_path / "out"))
    known = json.loads(KNOWN.read_text())
    assert _comparable(result.summary) == _comparable(known)
    assert result.summary["lost"] == 3 and result.summary["duplicated"] == 4
    assert _latencies(result.summary) == pytest.approx(_latencies(known), rel=0.1)


def _latencies(summary: dict[str, Any]) -> dict[str, float]:
    """Every latency figure by a flat name, and each task's count of completed messages."""
    out = {
        f"*/{span}/{pct}": value
        for span, by_pct in summary["latency_ms"].items()
        for pct, value in by_pct.items()
    }
    for row in summary["latency_by_task"]:
        for key, value in row.items():
            if key not in ("task_name", "queue"):
                out[f"{row['task_name']}/{row['queue']}/{key}"] = value
    return out
