"""Spark audit vs the naive single-process audit, side by side on one generated trace.

Both must reach the verdict planted by :mod:`benchmarks.gen_trace`; the benchmark prints wall
time, events/s and peak resident memory of each (the naive process itself; for Spark the
whole ``beetle audit`` process tree, JVM included), and the ratios. Running two sizes shows
how memory scales: the naive dict grows with the number of messages, Spark's heap is capped.

Beside every audit it measures three floors (:mod:`benchmarks.audit_floor`: Spark started the
same way plus one parsing read of the input): ``floor`` aggregates two fields of each line, so
Spark's JSON reader skips converting the others; ``floor-all`` aggregates every field the audit
reads, the read the audit cannot avoid; ``floor-group`` adds to that read the least grouping
any per-message audit needs (each event shuffled to its message and counted), so it shows
how much of the audit's time beyond the read is the shuffle this machine cannot spread out.
On a shared machine the audit's time beyond the floors and its ratios to them stay comparable
when the load is not; the audit's own step timings (``timings_s`` of its summary) are printed
too. ``--repeat`` runs everything several times, interleaved, and reports medians.
``--baseline DIR`` also audits with the source tree in DIR (``git archive <commit> | tar -x
-C DIR``): before and after, in the same run.

Usage::

    python -m benchmarks.bench_audit --events 138400 --repeat 5 --skip-naive  # 20,000 messages
    python -m benchmarks.bench_audit --events 10000000
    python -m benchmarks.bench_audit --events 1000000,10000000   # memory at two sizes
    python -m benchmarks.bench_audit --soak        # 100 M events (~30 GB): bounded memory
    python -m benchmarks.bench_audit --stages      # ... and where the time went, per stage

``--soak`` runs the naive checker under an address-space cap (``--naive-memory-gb``) so that
it fails with MemoryError instead of taking the machine down, and reports whether it did.
Traces are cached under ``--dir`` and reused when their expected verdict is there.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import spark_stages
from benchmarks.gen_trace import generate, plan_for_events

CHECKED = (
    "messages",
    "completed_once",
    "lost",
    "duplicated",
    "unexpected",
    "dead_lettered",
    "expired",
    "malformed_lines",
    "retried_messages",
    "completed_unobserved",
)
TARGET_S = 60.0
SMALL_TARGET_S = 15.0
SOAK_EVENTS = 100_000_000
#: label -> ``audit_floor --fields``: the read of two fields, of every field the audit reads,
#: and that read with each event shuffled to its message and counted (the least grouping)
FLOORS = {"floor": "two", "floor-all": "audit", "floor-group": "group"}


def _tree_rss(pid: int) -> tuple[int, int]:
    """(RSS of the whole process tree, RSS of its largest java process), in bytes."""
    try:
        import psutil
    except ImportError:
        return _proc_tree_rss(pid)
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    total = java = 0
    for p in procs:
        try:
            rss = p.memory_info().rss
            total += rss
            if "java" in p.name():
                java = max(java, rss)
        except psutil.Error:
            pass
    return total, java


def _proc_tree_rss(pid: int) -> tuple[int, int]:
    """/proc fallback when psutil is missing (Linux only)."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[int, str]] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            rss_pages = int(Path(f"/proc/{entry}/statm").read_text().split()[1])
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        info[int(entry)] = (rss_pages * page, name)
    total = java = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        rss, name = info.get(p, (0, ""))
        total += rss
        if "java" in name:
            java = max(java, rss)
        stack += children.get(p, [])
    return total, java


def measure(
    cmd: list[str],
    label: str,
    *,
    pythonpath: str | None = None,
    cap_bytes: int | None = None,
    event_log: Path | None = None,
) -> dict[str, Any]:
    """Run ``cmd``, sampling the memory of its process tree every 0.2 s.

    ``pythonpath`` puts another source tree first (the baseline) and runs the command in it:
    ``python -m`` puts the working directory ahead of PYTHONPATH, so a baseline started from
    this checkout would run this checkout's code. ``cap_bytes`` limits the process's address
    space, so a checker that needs more fails instead of swapping. ``event_log`` turns Spark's
    event log on, into that (emptied) directory (:mod:`benchmarks.spark_stages`).
    """
    first = pythonpath or os.getcwd()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([first, *sys.path[1:]])}
    if event_log is not None:
        shutil.rmtree(event_log, ignore_errors=True)
        event_log.mkdir(parents=True)
        env["PYSPARK_SUBMIT_ARGS"] = spark_stages.submit_args(event_log)

    def limit() -> None:
        if cap_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=limit,
        cwd=pythonpath or None,
    )
    peak = peak_java = 0
    while proc.poll() is None:
        total, java = _tree_rss(proc.pid)
        peak, peak_java = max(peak, total), max(peak_java, java)
        time.sleep(0.2)
    out, err = proc.communicate()
    took = time.perf_counter() - t0
    lines = out.decode().strip().splitlines()
    try:
        verdict = json.loads(lines[-1])
    except (IndexError, ValueError):
        if cap_bytes and b"MemoryError" in err:
            verdict = {"error": "MemoryError"}
        else:
            sys.exit(
                f"{label} printed no verdict (exit {proc.returncode}):\n{err.decode()[-3000:]}"
            )
    return {
        "label": label,
        "seconds": took,
        "peak_rss": peak,
        "peak_java": peak_java,
        "verdict": verdict,
        "exit": proc.returncode,
    }


def trace_for(events: int, root: Path) -> tuple[Path, dict[str, int]]:
    """A trace of about ``events`` lines with its expected verdict, reused when present."""
    path = root / f"trace-{events}"
    expected_file = root / f"trace-{events}.expected.json"
    if expected_file.exists() and any(path.glob("*.jsonl")):
        return path, json.loads(expected_file.read_text())
    t0 = time.perf_counter()
    expected = generate(plan_for_events(events, procs=os.cpu_count() or 2), path)
    print(
        f"generated {expected['events']:,} events in {time.perf_counter() - t0:.1f}s",
        file=sys.stderr,
    )
    return path, expected


def check(result: dict[str, Any], expected: dict[str, int]) -> bool:
    if result["label"] in FLOORS:
        return True
    if "error" in result["verdict"]:
        print(f"  {result['label']}: failed with {result['verdict']['error']}")
        return result["label"] == "naive"  # the soak's point: the naive checker cannot
    wrong = {
        k: (result["verdict"].get(k), expected[k])
        for k in CHECKED
        if k in expected and result["verdict"].get(k) != expected[k]
    }
    if wrong:
        print(f"  {result['label']}: WRONG verdict (got, expected): {wrong}")
    return not wrong


def _commands(
    trace: Path, out: Path, a: argparse.Namespace
) -> list[tuple[str, list[str], str | None]]:
    """(label, command, PYTHONPATH) of every run for one trace, in the order they run."""
    py = sys.executable
    audit = ["-m", "celery_beetle.cli", "audit", str(trace), "--out", str(out), "--quiet"]
    audit += ["--driver-memory", a.driver_memory]
    runs: list[tuple[str, list[str], str | None]] = []
    if not a.skip_naive:
        runs.append(("naive", [py, "-m", "celery_beetle.audit.naive", str(trace)], None))
    for label, fields in FLOORS.items():
        floor = [py, "-m", "benchmarks.audit_floor", str(trace), "--fields", fields]
        runs.append((label, [*floor, "--driver-memory", a.driver_memory], None))
    if a.baseline:
        runs.append(("before", [py, *audit], str(a.baseline)))
    runs.append(("spark", [py, *audit], None))
    return runs


def _timings(out: Path) -> dict[str, float] | None:
    """The audit's own step timings (``timings_s`` of the summary it just wrote)."""
    try:
        return dict(json.loads((out / "summary.json").read_text())["timings_s"])
    except (OSError, ValueError, KeyError):
        return None


def _steps(timings: dict[str, Any] | None, median: bool = False) -> str:
    if not timings:
        return ""
    cells = [f"{k} {statistics.median(v) if median else v:.1f} s" for k, v in timings.items()]
    return "  (" + ", ".join(cells) + ")"


def _median(rs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", help="comma-separated sizes; 10,000,000 (--soak: 100,000,000)")
    p.add_argument("--dir", default="/tmp/beetle-audit-bench", type=Path)
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--repeat", type=int, default=1, help="runs of each, interleaved; medians")
    p.add_argument("--baseline", type=Path, help="source tree of the version to compare with")
    p.add_argument("--soak", action="store_true", help=f"{SOAK_EVENTS:,} events, bounded memory")
    p.add_argument("--naive-memory-gb", type=float, help="address-space cap of the naive run")
    p.add_argument(
        "--stages",
        action="store_true",
        help="Spark's event log on; print where the last runs of the floors and the audit "
        "spent their time",
    )
    a = p.parse_args(argv)
    if a.soak:
        a.naive_memory_gb = a.naive_memory_gb or 4.0
    a.events = a.events or str(SOAK_EVENTS if a.soak else 10_000_000)
    cap = int(a.naive_memory_gb * 2**30) if a.naive_memory_gb else None
    a.dir.mkdir(parents=True, exist_ok=True)
    ok = True
    rows = []
    for events in [int(e) for e in a.events.split(",")]:
        trace, expected = trace_for(events, a.dir)
        n = expected["events"]
        size = sum(f.stat().st_size for f in trace.glob("*.jsonl"))
        print(f"\n== {n:,} events, {size / 1e9:.2f} GB, {expected['messages']:,} messages ==")
        runs: dict[str, list[dict[str, Any]]] = {}
        for k in range(a.repeat):
            for label, cmd, path in _commands(trace, a.dir / f"out-{events}", a):
                log = a.dir / f"events-{label}" if a.stages and label != "naive" else None
                r = measure(
                    cmd,
                    label,
                    pythonpath=path,
                    cap_bytes=cap if label == "naive" else None,
                    event_log=log,
                )
                ok &= check(r, expected)
                if label in ("before", "spark"):
                    r["timings"] = _timings(a.dir / f"out-{events}")
                r["events"] = n
                runs.setdefault(label, []).append(r)
                if a.repeat > 1:
                    steps = _steps(r.get("timings"))
                    print(f"  run {k + 1}: {label:<9} {r['seconds']:7.1f} s{steps}", flush=True)
        for label, rs in runs.items():
            secs = _median(rs, "seconds")
            peak = max(r["peak_rss"] for r in rs)
            java = max(r["peak_java"] for r in rs)
            spread = f" ({min(r['seconds'] for r in rs):.1f}-{max(r['seconds'] for r in rs):.1f})"
            print(
                f"  {label:<9} {secs:7.1f} s{spread if len(rs) > 1 else ''}  "
                f"{n / secs:>11,.0f} events/s  peak RSS {peak / 2**20:7,.0f} MB"
                + (f"  (JVM {java / 2**20:,.0f} MB)" if java else "")
            )
            rows.append({"label": label, "events": n, "peak_rss": peak})
        floors = {f: _median(runs[f], "seconds") for f in FLOORS}
        floor = floors["floor"]
        print(
            "  floors: floor = Spark start + read of message_id and ts_ms; "
            "floor-all = of every field the audit reads "
            f"(floor-all/floor x{floors['floor-all'] / floors['floor']:.2f}); "
            "floor-group = floor-all, each event shuffled to its message and counted "
            f"(floor-group/floor x{floors['floor-group'] / floors['floor']:.2f})"
        )
        for label in ("before", "spark"):
            if label in runs:
                secs = _median(runs[label], "seconds")
                against = ", ".join(
                    f"{f} x{secs / s:.2f} (+{secs - s:.1f} s)" for f, s in floors.items()
                )
                print(f"  {label:<9} vs {against}")
                steps: dict[str, list[float]] = {}
                for r in runs[label]:
                    for k, v in (r.get("timings") or {}).items():
                        steps.setdefault(k, []).append(v)
                if steps:
                    print(f"  {label:<9} steps (median):{_steps(steps, median=True)}")
        if a.stages:
            for label in ("floor-all", "floor-group", "before", "spark"):
                if label in runs:
                    stages, length = spark_stages.read_log(a.dir / f"events-{label}")
                    print(f"  {label}: Spark stages of its last run (s, MB)")
                    print(spark_stages.render(stages, length))
        if "before" in runs:
            ratio = _median(runs["before"], "seconds") / _median(runs["spark"], "seconds")
            print(f"  before/after: x{ratio:.2f}")
        if "naive" in runs and "error" not in runs["naive"][0]["verdict"]:
            nv, sp = runs["naive"], runs["spark"]
            print(
                f"  spark/naive: speed x{_median(nv, 'seconds') / _median(sp, 'seconds'):.2f}, "
                f"memory x{max(r['peak_rss'] for r in sp) / max(r['peak_rss'] for r in nv):.2f}"
            )
        spark_s = _median(runs["spark"], "seconds")
        target = TARGET_S if n >= 10_000_000 else SMALL_TARGET_S if n <= 200_000 else None
        if target and n <= 20_000_000:
            verdict = "met" if spark_s <= target else "NOT met"
            print(
                f"  target: <= {target:.0f} s -> {verdict} ({spark_s:.1f} s, floor {floor:.1f} s)"
            )
        if n >= 10_000_000:  # issue #28, T3: within twice the floor
            cells = ", ".join(
                f"x{spark_s / s:.2f} of {f} ({'met' if spark_s <= 2 * s else 'NOT met'})"
                for f, s in floors.items()
            )
            print(f"  target T3: <= 2x the floor -> {cells}")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"  load average after the run: {load:.1f} on {os.cpu_count()} cores")
    if len({r["events"] for r in rows}) > 1:
        print("\n== memory vs size ==")
        for label in dict.fromkeys(r["label"] for r in rows):
            cells = ", ".join(
                f"{r['events']:,}: {r['peak_rss'] / 2**20:,.0f} MB"
                for r in rows
                if r["label"] == label
            )
            print(f"  {label:<6} {cells}")
    print("\nverdicts: " + ("every run matches the planted verdict" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
