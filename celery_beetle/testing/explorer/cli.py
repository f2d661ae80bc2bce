"""``scripts/explore``: run scenarios by seed, for a number of seeds or minutes, or a soak.

``--seed S`` replays one scenario; ``--seeds N`` runs N seeds from ``--first`` (default: a
random start, printed); ``--minutes M`` stops starting scenarios after M minutes; ``--soak``
runs new seeds until stopped (Ctrl-C) or ``--minutes``. Progress is printed as it goes;
at the end a table: scenarios run, faults injected per kind, messages judged, and every
failing seed with the command that replays it. A failing seed is shrunk (``--shrink N``
runs at most) and the smallest scenario written under ``tests/explorer/`` as a test.
``--soak`` and ``--seeds N`` also write a page beside the table (``report.html`` under the
runs' directory, or ``--report PATH``; rewritten after every scenario): charts of the
scenarios over time, the faults per kind and the messages judged, and every failure with
its replay command and its first violating message's story (:mod:`.report`).

``--soak`` and ``--seeds N`` balance the seeds they run (:mod:`.coverage`): every other
scenario is the next seed in order, as an unbiased sample. The ones between are the lowest
seeds ahead that draw the newer kind (a fault, setting or workload of the later versions)
drawn fewest times so far, so that a rare kind such as ``replica_lag`` is drawn often in an
hour, not once or twice. A seed is still the same scenario and still replays with ``--seed
S``; ``--in-order`` runs the seeds one after another, as before. The table and the page say
how many times each newer kind was drawn.

Exit status 1 when any scenario failed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from itertools import count, islice
from pathlib import Path
from typing import Any

from celery_beetle.testing.explorer import checker
from celery_beetle.testing.explorer.coverage import BalancedSeeds, marks, tally
from celery_beetle.testing.explorer.runner import Cluster, Outcome, run_scenario
from celery_beetle.testing.explorer.scenario import Scenario, draw

__all__ = ["main", "replay_command"]


def replay_command(seed: int) -> str:
    return f"scripts/explore --seed {seed}"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="explore", description=__doc__)
    p.add_argument("--seed", type=int, action="append", help="run this seed (repeatable)")
    p.add_argument("--seeds", type=int, default=0, help="run N seeds")
    p.add_argument("--first", type=int, default=None, help="the first of --seeds/--soak")
    p.add_argument("--minutes", type=float, default=0.0, help="stop starting after M minutes")
    p.add_argument("--soak", action="store_true", help="new seeds until stopped or --minutes")
    p.add_argument(
        "--in-order", action="store_true", help="--seeds/--soak: seeds in order, unbalanced"
    )
    p.add_argument("--shrink", type=int, default=3, help="runs to shrink a failure (0: off)")
    p.add_argument("--tests-dir", default="tests/explorer", help="where regression tests go")
    p.add_argument("--keep", action="store_true", help="keep every run's files")
    p.add_argument("--dir", default=None, help="where runs' files go (default: a temp dir)")
    p.add_argument("--report", default=None, help="the soak's page (default: DIR/report.html)")
    p.add_argument(
        "--previous", default=None, help="the previous release's commit (default: HEAD~20)"
    )
    return p.parse_args(argv)


def _seeds(args: argparse.Namespace) -> Iterator[int]:
    if args.seed:
        yield from args.seed
        return
    first = args.first if args.first is not None else random.randrange(1, 10**6)
    limit = None if args.soak else (args.seeds or 1)
    if args.in_order:
        print(f"seeds from {first}, in order", flush=True)
        yield from islice(count(first), limit)
        return
    print(f"seeds from {first}, balanced over the newer kinds (--in-order: off)", flush=True)
    yield from islice(BalancedSeeds(first), limit)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    os.environ.setdefault("BEETLE_TEST_SERVERS", "local")
    if args.previous:
        from celery_beetle.testing.explorer.previous import ENV

        os.environ[ENV] = args.previous
    signal.signal(signal.SIGTERM, _interrupt)  # stopped like Ctrl-C: every process cleaned up
    base = Path(args.dir or tempfile.mkdtemp(prefix="beetle-explore-"))
    base.mkdir(parents=True, exist_ok=True)
    stop_at = time.monotonic() + args.minutes * 60 if args.minutes else None
    outcomes: list[Outcome] = []
    failing: dict[int, Outcome] = {}
    shrunk: dict[int, str] = {}
    shrunk_labels: set[str] = set()  # shrink the first failure of each kind only
    started = time.monotonic()
    report = _Report(Path(args.report) if args.report else base / "report.html")
    reporting = bool(args.soak or args.seeds)
    print(f"explorer: files under {base}", flush=True)
    if reporting:
        print(f"explorer: report at {report.path}", flush=True)
    cluster = Cluster(base / "servers").start()
    try:
        for seed in _seeds(args):
            if stop_at is not None and time.monotonic() > stop_at:
                break
            scenario = draw(seed)
            print(f"-> {scenario.describe()}", flush=True)
            outcome = run_scenario(cluster, scenario, _fresh_dir(base, seed))
            outcomes.append(outcome)
            _progress(outcome, outcomes, started)
            if outcome.failed:
                failing[seed] = outcome
                labels = checker.summary(outcome.violations, scenario)["findings"]
                time_left = stop_at is None or stop_at - time.monotonic() > 180
                if args.shrink and time_left and not set(labels) <= shrunk_labels:
                    shrunk_labels.update(labels)
                    from celery_beetle.testing.explorer.shrink import shrink, write_test

                    small = shrink(cluster, outcome, base / f"shrink-{seed}", budget=args.shrink)
                    rules = sorted({v.rule for v in outcome.violations})
                    shrunk[seed] = str(write_test(small, Path(args.tests_dir), rules))
                    print(f"   shrunk: {small.describe()} -> {shrunk[seed]}", flush=True)
            elif not args.keep:
                shutil.rmtree(outcome.base, ignore_errors=True)
            if reporting:
                report.add(outcome, shrunk.get(seed, ""))
    except KeyboardInterrupt:
        print("stopped (Ctrl-C)", flush=True)
    finally:
        cluster.close()
    _summary(outcomes, failing, shrunk, time.monotonic() - started)
    if reporting and report.rows:
        print(f"report: file://{report.path.resolve()}", flush=True)
    return 1 if failing else 0


class _Report:
    """The soak's page, rewritten after every scenario."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.started_at = time.time()
        self.rows: list[Any] = []

    def add(self, outcome: Outcome, regression_test: str) -> None:
        from celery_beetle.testing.explorer.report import Row, write_report

        s = checker.summary(outcome.violations, outcome.scenario)
        self.rows.append(
            Row(
                seed=outcome.scenario.seed,
                ended_at=time.time(),
                elapsed_s=outcome.elapsed_s,
                messages=outcome.messages,
                faults=dict(outcome.faults),
                violations=tuple(str(v) for v in outcome.violations),
                findings=tuple(s["findings"]),
                story=tuple(outcome.story),
                replay=replay_command(outcome.scenario.seed) if outcome.failed else "",
                regression_test=regression_test,
                describe=outcome.scenario.describe(),
                marks=tuple(sorted(marks(outcome.scenario))),
            )
        )
        try:
            write_report(self.path, self.rows, self.started_at)
        except Exception as exc:  # the page is a view: a soak goes on without it
            print(f"   report not written: {type(exc).__name__}: {exc}", flush=True)


def _fresh_dir(base: Path, seed: int) -> Path:
    """A directory of its own for a run of ``seed`` (a seed run twice keeps both runs'
    files apart: the checker reads every trace and ledger file of its directory)."""
    path, n = base / f"seed-{seed}", 1
    while path.exists():
        n += 1
        path = base / f"seed-{seed}-{n}"
    return path


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _progress(outcome: Outcome, outcomes: list[Outcome], started: float) -> None:
    faults = sum(sum(o.faults.values()) for o in outcomes)
    failures = sum(1 for o in outcomes if o.failed)
    state = "FAIL" if outcome.failed else "ok"
    print(
        f"   {state} seed {outcome.scenario.seed} in {outcome.elapsed_s}s, "
        f"{outcome.messages} messages, faults {dict(outcome.faults)} | "
        f"done {len(outcomes)}, faults so far {faults}, failures {failures}, "
        f"{(time.monotonic() - started) / 60:.1f} min",
        flush=True,
    )
    for note in outcome.notes:
        print(f"   note: {note}", flush=True)
    for v in outcome.violations[:8]:
        print(f"   {v}  <- {checker.finding(v, outcome.scenario)}", flush=True)
    if len(outcome.violations) > 8:
        print(f"   ... {len(outcome.violations) - 8} more ({outcome.base}/verdict.json)")
    if outcome.failed:
        print(f"   replay: {replay_command(outcome.scenario.seed)}", flush=True)


def _summary(
    outcomes: list[Outcome], failing: dict[int, Outcome], shrunk: dict[int, str], took: float
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    faults: Counter[str] = Counter()
    for o in outcomes:
        faults.update(o.faults)
    console = Console()
    totals = Table(title=f"fault explorer: {len(outcomes)} scenarios in {took / 60:.1f} min")
    totals.add_column("what")
    totals.add_column("count", justify="right")
    totals.add_row("scenarios run", str(len(outcomes)))
    totals.add_row("messages judged", str(sum(o.messages for o in outcomes)))
    totals.add_row("failing scenarios", str(len(failing)))
    for kind, n in sorted(faults.items()):
        totals.add_row(f"fault: {kind}", str(n))
    for mark, n in tally(o.scenario for o in outcomes).items():
        totals.add_row(f"drew: {mark}", str(n))
    console.print(totals)
    if failing:
        table = Table(title="failing seeds")
        for col in ("seed", "rules", "looks like", "replay", "regression test"):
            table.add_column(col)
        for seed, o in failing.items():
            s = checker.summary(o.violations, o.scenario)
            table.add_row(
                str(seed),
                escape(", ".join(f"{k} x{v}" for k, v in s["rules"].items())),
                escape("; ".join(s["findings"])),
                replay_command(seed),
                escape(shrunk.get(seed, "-")),
            )
        console.print(table)


def scenario_of(seed: int) -> Scenario:
    return draw(seed)
