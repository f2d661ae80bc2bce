"""``python -m celery_beetle.testing.conformance``: Celery's own suites under both transports.

Downloads the installed Celery's sdist, runs the chosen files of its ``t/integration`` over
``pyamqp://`` (plain Celery) and over ``beetle://`` (every task a BeetleTask) on local
servers, and prints per suite what passed under both, what failed only under beetle, and
what failed under both. Exit status 1 when a test failed only under beetle.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from celery_beetle.testing.conformance.results import compare
from celery_beetle.testing.conformance.runner import TRANSPORTS, run_suite, running_servers
from celery_beetle.testing.conformance.sdists import SdistError, installed_version, unpack_tests

__all__ = ["main"]

SUITES = {"tasks": "t/integration/test_tasks.py", "canvas": "t/integration/test_canvas.py"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/conformance", description=__doc__)
    parser.add_argument(
        "suites", nargs="*", default=["tasks"], metavar="SUITE",
        help=f"{', '.join(SUITES)} or a path under the sdist's t/ (default: tasks)",
    )  # fmt: skip
    parser.add_argument("-k", dest="select", help="pytest's -k expression, for a slice")
    parser.add_argument(
        "--transport", choices=TRANSPORTS, action="append",
        help="run under this transport only (repeatable; default: both)",
    )  # fmt: skip
    parser.add_argument("--parallel", action="store_true", help="run the two transports at once")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "beetle-conformance",
        help="where the sdists, servers' data, logs and JUnit files go",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    version = installed_version("celery")
    try:
        tree = unpack_tests("celery", version, args.dir / "sdists")
    except SdistError as error:
        print(f"conformance: {error}", file=sys.stderr)
        return 2
    transports = args.transport or list(TRANSPORTS)
    differences = 0
    out = args.dir / "runs" / time.strftime("%Y%m%d-%H%M%S")
    with running_servers(out / "servers") as servers:
        for suite in args.suites:
            path = SUITES.get(suite, suite)
            runs = run_suite(
                tree, [path], servers, out, select=args.select,
                parallel=args.parallel, transports=transports,
            )  # fmt: skip
            for run in runs.values():
                print(f"{path} over {run.transport}: {run.seconds:.0f} s, log {run.log}")
            if len(runs) < 2:
                continue
            comparison = compare(
                f"celery {version} {path}", runs["pyamqp"].outcomes, runs["beetle"].outcomes
            )
            print("\n".join(comparison.lines()), flush=True)
            differences += len(comparison.failed_only_beetle)
    return 1 if differences else 0
