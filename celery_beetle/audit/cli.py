"""``beetle audit``: a thin click command over :mod:`celery_beetle.audit.job`, registered on
``beetle`` by :mod:`celery_beetle.cli`. Spark (pyspark, matplotlib) is imported inside the
command, so that ``beetle --help`` starts in a fraction of a second.

Exit status: 0 when the verdict is clean, 1 when any message is lost, duplicated or
unexpected, 2 for usage errors (a local trace path that matches nothing among them, found
before Spark starts), 3 when the audit could not run or the trace holds no valid event
(nothing to judge is not a clean verdict).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import click

__all__ = ["audit"]

EXIT_BAD_VERDICT = 1
EXIT_AUDIT_FAILED = 3


def _silent(_msg: str) -> None:
    """The step callback when there is no terminal to show progress on."""


class _Display:
    """The audit's status line on a terminal: the step's name, tasks done and time left."""

    def __init__(self, status: Any, console: Any) -> None:
        self.status, self.console = status, console
        self.current = "starting Spark"

    def step(self, msg: str) -> None:
        from rich.text import Text

        self.console.log(Text(msg))  # a step may name a path: not markup
        self.current = msg
        self.status.update(Text(msg))

    def tasks(self, progress: Any) -> None:
        from rich.text import Text

        from celery_beetle.audit.progress import format_progress

        self.status.update(Text(format_progress(self.current, progress)))


@contextmanager
def _progress(enabled: bool) -> Iterator[_Display | None]:
    """A status line on a terminal; nothing when piped or under CI."""
    if not enabled:
        yield None
        return
    from rich.console import Console

    console = Console(stderr=True)
    with console.status("starting Spark") as status:
        yield _Display(status, console)


@click.command()
@click.argument("trace_path", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, help="Directory (or Hadoop URL) for results.")
@click.option("--master", default=None, help="Spark master URL; default local[*].")
@click.option("--driver-memory", default="2g", show_default=True, help="Driver heap in local mode.")
@click.option(
    "--skew-tolerance-ms",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Runs overlapping by less than this are not reported (allowed clock skew).",
)
@click.option(
    "--samples",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Sample message ids kept per bad class in summary.json.",
)
@click.option(
    "--tables",
    is_flag=True,
    help="Also write Parquet tables (messages by verdict, latency, brokers) under --out.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def audit(
    trace_path: tuple[str, ...],
    out_dir: str,
    master: str | None,
    driver_memory: str,
    skew_tolerance_ms: int,
    samples: int,
    tables: bool,
    quiet: bool,
) -> None:
    """Audit trace events: was every message run exactly once?

    TRACE_PATH is one or more files, directories or globs, local or any Hadoop URL
    (s3a://, hdfs://). Writes summary.json and report.html (and with --tables the Parquet
    tables) under --out and exits 1 when any message is lost, duplicated or unexpected.
    """
    _check_local_paths(trace_path)
    try:
        from celery_beetle.audit import job
    except ImportError as exc:
        raise click.ClickException(
            f"beetle audit needs pyspark and matplotlib ({exc}); "
            "install them with: pip install 'kombu-beetle[audit]'"
        )
    show = not quiet and sys.stderr.isatty()
    try:
        with _progress(show) as display, ExitStack() as stack:
            spark = job.build_session(
                master,
                driver_memory=driver_memory,
                input_bytes=job.local_input_bytes(list(trace_path)),
            )
            if display is not None:
                from celery_beetle.audit.progress import StageWatcher

                stack.enter_context(StageWatcher(spark.sparkContext.statusTracker(), display.tasks))
            result = job.run_audit(
                spark,
                list(trace_path),
                out_dir,
                skew_tolerance_ms=skew_tolerance_ms,
                samples_per_class=samples,
                tables=tables,
                step=display.step if display else _silent,
            )
    except Exception as exc:
        click.echo(f"beetle audit: the audit could not run: {exc}", err=True)
        sys.exit(EXIT_AUDIT_FAILED)
    _print_verdict(result.summary, result.files, show)
    from celery_beetle.audit import class_cache

    class_cache.publish(spark)  # a first audit's class archive, for the next one
    if result.empty:
        click.echo(
            f"beetle audit: no valid trace event in {' '.join(trace_path)} "
            f"({result.summary['malformed_lines']} malformed lines): nothing to judge. Check "
            "the path, and that the run traced (beetle_trace_dir / the trace_dir option)",
            err=True,
        )
        sys.exit(EXIT_AUDIT_FAILED)
    sys.exit(0 if result.ok else EXIT_BAD_VERDICT)


def _check_local_paths(paths: tuple[str, ...]) -> None:
    """A local path (no ``scheme://``) that names no file, directory or glob match is a
    usage error naming it, before Spark takes its half a minute to start."""
    import glob
    import os

    for path in paths:
        if "://" in path and not path.startswith("file://"):
            continue
        local = path.removeprefix("file://")
        if not (os.path.exists(local) or glob.glob(local)):
            raise click.BadParameter(
                f"{path}: no such file, directory or glob match; give where the workers "
                "wrote their trace (beetle_trace_dir)",
                param_hint="TRACE_PATH",
            )


def _print_verdict(summary: dict[str, object], files: dict[str, str], rich_output: bool) -> None:
    from celery_beetle.audit.verdicts import BAD_VERDICTS, SUMMARY_COUNTS

    counts = {k: summary[k] for k in SUMMARY_COUNTS}
    if not rich_output:
        click.echo(json.dumps(counts))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="beetle audit", show_header=True)
    table.add_column("verdict")
    table.add_column("count", justify="right")
    for k, v in counts.items():
        bad = k in BAD_VERDICTS and v
        table.add_row(f"[red]{k}[/]" if bad else k, f"{v:,}" if isinstance(v, int) else str(v))
    console = Console()
    console.print(table)
    console.print(f"summary: {files['summary']}\nreport:  {files['report']}", markup=False)
