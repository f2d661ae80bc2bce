"""Where a Spark run's time went, from its event log: per stage, wall and task time, CPU,
GC, input and shuffle bytes, grouped by the job description the audit sets for each step.

:mod:`benchmarks.bench_audit` (``--stages``) runs the audit and the floors with Spark's event
log on (:func:`submit_args`) and prints this beside their times, so the audit's time beyond
its floor is explained stage by stage: the read, the shuffle write, the grouping, the queries
of the summary, and the time no stage ran (the driver planning, Python rendering the report).

Usage: ``python -m benchmarks.spark_stages EVENT_LOG_DIR``
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Stage", "read_log", "render", "submit_args"]


def submit_args(log_dir: Path) -> str:
    """``PYSPARK_SUBMIT_ARGS`` that make a local session write an uncompressed event log."""
    return (
        "--conf spark.eventLog.enabled=true --conf spark.eventLog.compress=false "
        f"--conf spark.eventLog.dir=file://{log_dir} pyspark-shell"
    )


@dataclass
class Stage:
    """One completed stage, its metrics summed over its tasks (seconds, MB)."""

    stage_id: int
    job: str
    tasks: int
    start_s: float
    wall_s: float
    run_s: float
    cpu_s: float
    gc_s: float
    input_mb: float
    shuffle_write_mb: float
    shuffle_read_mb: float
    spilled_mb: float


def _metric(acc: dict[str, Any], name: str) -> float:
    return float(acc.get(f"internal.metrics.{name}", 0) or 0)


def read_log(path: Path) -> tuple[list[Stage], float]:
    """The stages of the event log at ``path`` (a file, or a directory holding one) and the
    application's length in seconds (its start to its last stage's end)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        path = next(p for p in files if "appstatus" not in p.name)
    app_start = 0.0
    job_of_stage: dict[int, str] = {}
    stages: list[Stage] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            kind = e["Event"]
            if kind == "SparkListenerApplicationStart":
                app_start = e["Timestamp"] / 1000
            elif kind == "SparkListenerJobStart":
                desc = (e.get("Properties") or {}).get("spark.job.description") or "(no step)"
                for sid in e["Stage IDs"]:
                    job_of_stage[sid] = desc
            elif kind == "SparkListenerStageCompleted":
                s = e["Stage Info"]
                acc = {a["Name"]: a.get("Value") for a in s.get("Accumulables", [])}
                start = s["Submission Time"] / 1000
                stages.append(
                    Stage(
                        stage_id=s["Stage ID"],
                        job=job_of_stage.get(s["Stage ID"], "(no step)"),
                        tasks=s["Number of Tasks"],
                        start_s=start - app_start,
                        wall_s=s["Completion Time"] / 1000 - start,
                        run_s=_metric(acc, "executorRunTime") / 1e3,
                        cpu_s=_metric(acc, "executorCpuTime") / 1e9,
                        gc_s=_metric(acc, "jvmGCTime") / 1e3,
                        input_mb=_metric(acc, "input.bytesRead") / 1e6,
                        shuffle_write_mb=_metric(acc, "shuffle.write.bytesWritten") / 1e6,
                        shuffle_read_mb=(
                            _metric(acc, "shuffle.read.localBytesRead")
                            + _metric(acc, "shuffle.read.remoteBytesRead")
                        )
                        / 1e6,
                        spilled_mb=_metric(acc, "diskBytesSpilled") / 1e6,
                    )
                )
    stages.sort(key=lambda s: s.start_s)
    end = max((s.start_s + s.wall_s for s in stages), default=0.0)
    return stages, end


def render(stages: list[Stage], length_s: float, indent: str = "    ") -> str:
    """A table of the stages (the small ones folded into one line per step) and the time no
    stage ran."""
    lines = [
        f"{indent}{'start':>6} {'wall':>6} {'tasks':>5} {'task':>6} {'cpu':>6} {'gc':>5} "
        f"{'input':>7} {'shuf w':>7} {'shuf r':>7} {'spill':>6}  step"
    ]
    busy = 0.0
    last_end = 0.0
    small: dict[str, list[Stage]] = {}
    for s in stages:
        # stages may overlap (concurrent jobs): count each second once
        end = s.start_s + s.wall_s
        busy += max(0.0, end - max(s.start_s, last_end))
        last_end = max(last_end, end)
        if s.wall_s < 0.5:
            small.setdefault(s.job, []).append(s)
            continue
        lines.append(
            f"{indent}{s.start_s:6.1f} {s.wall_s:6.1f} {s.tasks:5d} {s.run_s:6.1f} "
            f"{s.cpu_s:6.1f} {s.gc_s:5.1f} {s.input_mb:6.0f}M {s.shuffle_write_mb:6.0f}M "
            f"{s.shuffle_read_mb:6.0f}M {s.spilled_mb:5.0f}M  {s.job}"
        )
    for job, folded in small.items():
        wall = sum(s.wall_s for s in folded)
        lines.append(f"{indent}{'':6} {wall:6.1f} {len(folded):>5} stages under 0.5 s  {job}")
    idle = max(0.0, length_s - busy)
    lines.append(
        f"{indent}no stage running: {idle:.1f} s of the session's {length_s:.1f} s "
        "(planning, Python between queries)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    stages, length = read_log(Path(args[0]))
    print(render(stages, length))
    return 0


if __name__ == "__main__":
    sys.exit(main())
