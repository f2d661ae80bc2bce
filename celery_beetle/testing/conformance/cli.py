"""``python -m celery_beetle.testing.conformance``: Celery's and kombu's own suites under both
transports.

Downloads the installed Celery's (and kombu's) sdist and runs the chosen files of its
``t/integration`` over ``pyamqp://`` (plain Celery) and over ``beetle://`` (every task a
BeetleTask; for kombu, its transport suite with ``beetle://`` URLs) on local servers, and
prints per suite what passed under both, what failed only under beetle, and what failed
under both. Exit status 1 when a test failed only under beetle and the differences table
(:mod:`.differences`) does not explain it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from celery_beetle.testing.conformance import kombu
from celery_beetle.testing.conformance.differences import DIFFERENCES
from celery_beetle.testing.conformance.overrides import CONFTEST
from celery_beetle.testing.conformance.results import compare
from celery_beetle.testing.conformance.runner import TRANSPORTS, Run, run_suite, running_servers
from celery_beetle.testing.conformance.sdists import SdistError, installed_version, unpack_tests

__all__ = ["SUITES", "main"]

#: Celery's suites by short name; ``kombu`` is kombu's transport suite
SUITES = {"tasks": "t/integration/test_tasks.py", "canvas": "t/integration/test_canvas.py"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/conformance", description=__doc__)
    parser.add_argument(
        "suites", nargs="*", default=["tasks"], metavar="SUITE",
        help=f"{', '.join(SUITES)}, kombu, or a path under Celery's t/ (default: tasks)",
    )  # fmt: skip
    parser.add_argument("-k", dest="select", help="pytest's -k expression, for a slice")
    parser.add_argument(
        "--transport", choices=TRANSPORTS, action="append",
        help="run under this transport only (repeatable; default: both)",
    )  # fmt: skip
    parser.add_argument("--parallel", action="store_true", help="run the transports at once")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "beetle-conformance",
        help="where the sdists, servers' data, logs and JUnit files go",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    transports = args.transport or list(TRANSPORTS)
    try:
        trees = {
            package: unpack_tests(package, installed_version(package), args.dir / "sdists")
            for package in ("celery", *(["kombu"] if "kombu" in args.suites else []))
        }
    except SdistError as error:
        print(f"conformance: {error}", file=sys.stderr)
        return 2
    (trees["celery"] / "t" / "conftest.py").write_text(CONFTEST)
    unexplained = 0
    out = args.dir / "runs" / time.strftime("%Y%m%d-%H%M%S")
    with running_servers(out / "servers") as servers:
        for suite in args.suites:
            if suite == "kombu":
                path = kombu.SUITE
                copies = {"pyamqp": trees["kombu"], "beetle": kombu.beetle_copy(trees["kombu"])}
                chosen = {t: copies[t] for t in transports}
                environment = servers.kombu_environment
                name = f"kombu {installed_version('kombu')} {path}"
            else:
                path = SUITES.get(suite, suite)
                chosen = dict.fromkeys(transports, trees["celery"])
                environment = servers.environment
                name = f"celery {installed_version('celery')} {path}"
            # kombu's suite names its queues and uses the default vhost: one run at a time
            parallel = args.parallel and suite != "kombu"
            runs = run_suite(
                chosen, [path], environment, out, select=args.select, parallel=parallel
            )
            unexplained += report(name, runs)
    return 1 if unexplained else 0


def report(name: str, runs: dict[str, Run]) -> int:
    """Print one suite's runs and their comparison; the differences nothing explains."""
    for run in runs.values():
        print(f"{name} over {run.transport}: {run.seconds:.0f} s, log {run.log}")
    if len(runs) < 2:
        return 0
    comparison = compare(name, runs["pyamqp"].outcomes, runs["beetle"].outcomes)
    print("\n".join(comparison.lines()))
    explained = [test for test in comparison.failed_only_beetle if test in DIFFERENCES]
    for test in explained:
        print(f"  explained: {test}: {DIFFERENCES[test]}")
    print(flush=True)
    return len(comparison.failed_only_beetle) - len(explained)
