"""The naive checker (what the pytest plugin judges a test's trace with) and the Spark audit
reach the same verdicts on the same traces: the known-verdict trace, generated ones with
every class planted, and a hand-built one with replays and an unobserved completion."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gen_trace import Plan, generate, plan_for_events
from celery_beetle.audit import naive
from celery_beetle.audit.verdicts import BAD_VERDICTS, SUMMARY_COUNTS
from tests.audit.test_known_verdict import KNOWN, _plan

pytestmark = pytest.mark.spark


def _spark_verdict(spark, trace: Path, out: Path) -> tuple[dict[str, int], dict[str, list[str]]]:
    from celery_beetle.audit import job

    summary = job.run_audit(spark, str(trace), str(out), samples_per_class=1000).summary
    samples = {v: sorted(summary["samples"][v]) for v in BAD_VERDICTS}
    return {k: summary[k] for k in SUMMARY_COUNTS}, samples


def _plans() -> list[Plan]:
    return [
        _plan(),  # the known-verdict trace
        plan_for_events(3000, lost=4, duplicated=3, overlapped=3, unexpected=2, seed=3, procs=1),
        Plan(
            messages=150,
            lost=1,
            unobserved=5,
            retried=10,
            dead_lettered=3,
            expired=4,
            non_redundant_pct=50,
            skew_ms=900,
            malformed=3,
            procs=1,
            seed=23,
        ),
    ]


@pytest.mark.parametrize("plan", _plans(), ids=["known", "every-class", "skewed"])
def test_naive_and_spark_give_the_same_verdict_on_generated_traces(spark, tmp_path, plan):
    generate(plan, tmp_path / "trace")
    counts, samples = _spark_verdict(spark, tmp_path / "trace", tmp_path / "out")
    result = naive.judge(naive.expand([tmp_path / "trace"]))
    assert result.counts == counts
    assert result.ids == samples


def test_the_naive_checker_reproduces_the_recorded_known_verdict(tmp_path):
    import json

    generate(_plan(), tmp_path / "trace")
    known = json.loads(KNOWN.read_text())
    result = naive.judge(naive.expand([tmp_path / "trace"]))
    assert result.counts == {k: known.get(k, 0) for k in SUMMARY_COUNTS}
    assert result.ids["lost"] == sorted(known["samples"]["lost"])


def test_naive_and_spark_agree_on_replays_and_unfinished_replays(spark, tmp_path, trace):
    trace.published("ok", 1).run("ok", 2, 3)
    # dead-lettered, replayed, then completed once: replayed
    trace.published("r1", 1).run("r1", 2, 3, outcome="failed")
    trace.ev("dead_lettered", "r1", 3.1).ev("replayed", "r1", 10, worker=None)
    trace.run("r1", 11, 12, attempt=1, worker="w2", pid=2)
    # replayed, and its run never ended: lost
    trace.published("r2", 1).run("r2", 2, 3, outcome="failed")
    trace.ev("dead_lettered", "r2", 3.1).ev("replayed", "r2", 10, worker=None)
    # completion unobserved (worker killed), the other copy saw "completed" in the store
    trace.published("u", 1).ev("started", "u", 2, attempt=1)
    trace.ev("duplicate", "u", 4, worker="w2", detail={"status": "c"})
    # two overlapping runs, one completion: duplicated
    trace.published("o", 1).run("o", 2, 6).run("o", 2.5, 7, outcome="failed", worker="w2")
    # the outbox: committed and relayed; committed, never relayed; set aside; enqueued and run
    # with its publish events lost (not unexpected)
    trace.ev("enqueued", "ob1", 0.5, worker=None).published("ob1", 1).run("ob1", 2, 3)
    trace.ev("enqueued", "ob2", 0.5, worker=None)
    trace.ev("enqueued", "ob3", 0.5, worker=None)
    trace.ev("relayed", "ob3", 0.6, worker=None, detail={"aside": "too old"})
    trace.ev("enqueued", "ob4", 0.5, worker=None).run("ob4", 2, 3)
    trace.raw('{"ts_ms": 1.5, "event": "started"}').raw("")
    trace.write(tmp_path / "trace")
    counts, samples = _spark_verdict(spark, tmp_path / "trace", tmp_path / "out")
    result = naive.judge(naive.expand([tmp_path / "trace"]))
    assert result.counts == counts
    assert result.ids == samples
    assert (counts["replayed"], counts["lost"], counts["duplicated"]) == (1, 1, 1)
    assert counts["completed_unobserved"] == 1
    assert (counts["never_relayed"], counts["set_aside"]) == (1, 1)
