"""benchmarks.spark_stages reads a Spark event log into per-stage figures."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import spark_stages


def _stage(stage_id: int, start_ms: int, end_ms: int, **metrics: int) -> dict[str, object]:
    return {
        "Event": "SparkListenerStageCompleted",
        "Stage Info": {
            "Stage ID": stage_id,
            "Stage Name": f"stage {stage_id}",
            "Number of Tasks": 2,
            "Submission Time": start_ms,
            "Completion Time": end_ms,
            "Accumulables": [
                {"Name": f"internal.metrics.{k}", "Value": v} for k, v in metrics.items()
            ],
        },
    }


def _log(tmp_path: Path) -> Path:
    app = tmp_path / "eventlog_v2_local-1" / "events_1_local-1"
    app.parent.mkdir()
    events = [
        {"Event": "SparkListenerApplicationStart", "Timestamp": 1_000_000},
        {
            "Event": "SparkListenerJobStart",
            "Stage IDs": [0, 1],
            "Properties": {"spark.job.description": "reading"},
        },
        _stage(0, 1_004_000, 1_010_000, executorRunTime=11_000, executorCpuTime=9 * 10**9),
        _stage(1, 1_010_000, 1_010_200, **{"shuffle.write.bytesWritten": 5_000_000}),
        {"Event": "SparkListenerJobStart", "Stage IDs": [2]},
        _stage(2, 1_012_000, 1_013_000, jvmGCTime=300),
    ]
    app.write_text("".join(json.dumps(e) + "\n" for e in events))
    return tmp_path


def test_stages_are_timed_from_the_application_start_and_named_by_their_job(
    tmp_path: Path,
) -> None:
    stages, length = spark_stages.read_log(_log(tmp_path))
    assert [s.stage_id for s in stages] == [0, 1, 2]
    first = stages[0]
    assert (first.job, first.start_s, first.wall_s) == ("reading", 4.0, 6.0)
    assert (first.run_s, first.cpu_s) == (11.0, 9.0)
    assert stages[1].shuffle_write_mb == 5.0
    assert stages[2].job == "(no step)" and stages[2].gc_s == 0.3
    assert length == 13.0


def test_the_table_folds_short_stages_and_counts_the_time_no_stage_ran(tmp_path: Path) -> None:
    stages, length = spark_stages.read_log(_log(tmp_path))
    table = spark_stages.render(stages, length)
    assert "1 stages under 0.5 s  reading" in table
    # 13 s long, stages busy 6 + 0.2 + 1 s
    assert "no stage running: 5.8 s of the session's 13.0 s" in table


def test_submit_args_turn_an_uncompressed_event_log_on(tmp_path: Path) -> None:
    args = spark_stages.submit_args(tmp_path)
    assert "spark.eventLog.enabled=true" in args and "spark.eventLog.compress=false" in args
    assert args.endswith("pyspark-shell") and f"file://{tmp_path}" in args
