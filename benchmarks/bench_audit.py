"""Spark audit vs the naive single-process audit, side by side on one generated trace.

Both must reach the verdict planted by :mod:`benchmarks.gen_trace`; the benchmark prints wall
time, events/s and peak resident memory of each (the naive process itself; for Spark the
whole ``beetle audit`` process tree, JVM included), and the ratios. Running two sizes shows
how memory scales: the naive dict grows with the number of messages, Spark's heap is capped.

Usage::

    python -m benchmarks.bench_audit --events 10000000
    python -m benchmarks.bench_audit --events 1000000,10000000   # memory at two sizes

Traces are cached under ``--dir`` and reused when their expected verdict is there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
TARGET_S = 120.0


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


def measure(cmd: list[str], label: str) -> dict[str, Any]:
    """Run ``cmd``, sampling the memory of its process tree every 0.2 s."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path[1:]])}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
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
        sys.exit(f"{label} printed no verdict (exit {proc.returncode}):\n{err.decode()[-3000:]}")
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
    wrong = {
        k: (result["verdict"].get(k), expected[k])
        for k in CHECKED
        if k in expected and result["verdict"].get(k) != expected[k]
    }
    if wrong:
        print(f"  {result['label']}: WRONG verdict (got, expected): {wrong}")
    return not wrong


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", default="10000000", help="comma-separated sizes")
    p.add_argument("--dir", default="/tmp/beetle-audit-bench", type=Path)
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--driver-memory", default="2g")
    a = p.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    ok = True
    rows = []
    for events in [int(e) for e in a.events.split(",")]:
        trace, expected = trace_for(events, a.dir)
        n = expected["events"]
        size = sum(f.stat().st_size for f in trace.glob("*.jsonl"))
        print(f"\n== {n:,} events, {size / 1e9:.2f} GB, {expected['messages']:,} messages ==")
        results = []
        if not a.skip_naive:
            naive = [sys.executable, "-m", "benchmarks.naive_audit", str(trace)]
            results.append(measure(naive, "naive"))
        spark = [
            sys.executable,
            "-m",
            "celery_beetle.cli",
            "audit",
            str(trace),
            "--out",
            str(a.dir / f"out-{events}"),
            "--quiet",
            "--driver-memory",
            a.driver_memory,
        ]
        results.append(measure(spark, "spark"))
        for r in results:
            ok &= check(r, expected)
            r["events"] = n
            rows.append(r)
            java = f"  (JVM {r['peak_java'] / 2**20:,.0f} MB)" if r["peak_java"] else ""
            print(
                f"  {r['label']:<6} {r['seconds']:7.1f} s  {n / r['seconds']:>11,.0f} events/s"
                f"  peak RSS {r['peak_rss'] / 2**20:7,.0f} MB{java}"
            )
        if len(results) == 2:
            nv, sp = results
            print(
                f"  spark/naive: speed x{nv['seconds'] / sp['seconds']:.2f}, "
                f"memory x{sp['peak_rss'] / nv['peak_rss']:.2f}"
            )
        if n >= 10_000_000:
            spark_s = results[-1]["seconds"]
            verdict = "met" if spark_s <= TARGET_S else "NOT met"
            print(f"  target: 10 M events <= {TARGET_S:.0f} s -> {verdict} ({spark_s:.0f} s)")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"  load average after the run: {load:.1f} on {os.cpu_count()} cores")
    by_label: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    if len(rows) > 2:
        print("\n== memory vs size ==")
        for label, rs in by_label.items():
            cells = ", ".join(f"{r['events']:,}: {r['peak_rss'] / 2**20:,.0f} MB" for r in rs)
            print(f"  {label:<6} {cells}")
    print("\nverdicts: " + ("every run matches the planted verdict" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
