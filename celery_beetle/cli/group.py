"""The ``beetle`` command line.

``main`` is a click group; each operation is a subcommand registered with ``@main.command()``
(in this module or in a module that imports ``main``). Heavy dependencies (pyspark,
matplotlib, celery) are imported inside the subcommand that needs them, so ``beetle --help``
and quick subcommands start in a fraction of a second.

``beetle dead-letters`` (``beetle dead``) and ``beetle queues`` live in
:mod:`celery_beetle.ops.cli`; ``beetle relay`` and ``beetle outbox`` in
:mod:`celery_beetle.outbox.cli`.

Exit status of ``beetle audit``: 0 when the verdict is clean, 1 when any message is lost,
duplicated or unexpected, 2 for usage errors, 3 when the audit could not run or the trace
holds no valid event (nothing to judge is not a clean verdict).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import click

__all__ = ["main"]

EXIT_BAD_VERDICT = 1
EXIT_AUDIT_FAILED = 3


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kombu-beetle", message="%(version)s")
def main() -> None:
    """kombu-beetle / celery-beetle: Celery over N RabbitMQ brokers, exactly once."""


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


@main.command()
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


def _url_from(value: str | None, path: str | None, what: str, required: bool) -> str | None:
    """The URL given directly, or read from the file ``path`` (a mounted secret)."""
    if value and path:
        raise click.UsageError(f"give the {what} URL or a file holding it, not both")
    if path:
        try:
            with open(path, encoding="utf-8") as secret:
                text = secret.read().strip()
        except OSError as exc:
            raise click.UsageError(f"cannot read the {what} URL from {path}: {exc.strerror}")
        if not text:
            raise click.UsageError(f"the {what} URL file {path} is empty")
        return text
    if required and not value:
        raise click.UsageError(
            f"no {what} URL: set BEETLE_BROKER_URL or BEETLE_BROKER_URL_FILE, "
            "or give --broker-url-file (or BROKER_URL)"
        )
    return value or None


@main.command()
@click.argument("broker_url", envvar="BEETLE_BROKER_URL", required=False)
@click.option(
    "--broker-url-file",
    envvar="BEETLE_BROKER_URL_FILE",
    type=click.Path(dir_okay=False),
    help="Read the beetle:// URL from this file (e.g. a mounted secret).",
)
@click.option("--redis", "redis_url", envvar="BEETLE_REDIS_URL", help="The dedup store's URL.")
@click.option(
    "--redis-file",
    "redis_url_file",
    envvar="BEETLE_REDIS_URL_FILE",
    type=click.Path(dir_okay=False),
    help="Read the dedup store's URL from this file.",
)
@click.option("--queue", "-Q", "queues", multiple=True, help="Report this queue (repeatable).")
@click.option(
    "--watch", "-w", is_flag=True, help="A live view, refreshed every second, until Ctrl-C."
)
@click.option(
    "--metrics",
    "metrics_urls",
    multiple=True,
    metavar="URL",
    help="With --watch: a worker's metrics endpoint (beetle_metrics_port), e.g. "
    "http://worker1:9808/metrics, for gate verdicts and dead letters (repeatable).",
)
def status(
    broker_url: str | None,
    broker_url_file: str | None,
    redis_url: str | None,
    redis_url_file: str | None,
    queues: tuple[str, ...],
    watch: bool,
    metrics_urls: tuple[str, ...],
) -> None:
    """Is every broker of BROKER_URL (a beetle:// URL) up, and the dedup store?

    Exits 1 when a broker or the store is down, so it can serve as a health check.
    --watch shows the same live, with the workers' verdict rates and dead letters
    from their --metrics endpoints.

    A URL given on the command line (BROKER_URL, --redis) is visible to every user of the
    machine through ps: pass URLs with passwords in BEETLE_BROKER_URL / BEETLE_REDIS_URL,
    or in files named by --broker-url-file / --redis-file (or BEETLE_BROKER_URL_FILE /
    BEETLE_REDIS_URL_FILE). Passwords are masked in the output.
    """
    broker_url = _url_from(broker_url, broker_url_file, "broker", required=True)
    redis_url = _url_from(redis_url, redis_url_file, "dedup store", required=False)
    assert broker_url is not None
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from celery_beetle.cli import status as report
    from kombu_beetle.errors import InvalidBrokerURL, InvalidTransportOption

    if metrics_urls and not watch:
        raise click.UsageError("--metrics goes with --watch")
    if watch:
        from celery_beetle.cli.top import watch as live_view

        try:
            live_view(broker_url, redis_url, queues, metrics_urls)
        except (InvalidBrokerURL, InvalidTransportOption) as exc:
            raise click.BadParameter(str(exc), param_hint="BROKER_URL")
        except KeyboardInterrupt:
            pass
        return
    try:
        brokers = report.brokers(broker_url, queues)
    except (InvalidBrokerURL, InvalidTransportOption) as exc:
        raise click.BadParameter(str(exc), param_hint="BROKER_URL")
    # names, versions and errors come from outside: escaped, so that rich shows their
    # brackets rather than reading them as markup ("[/db]" in a bad URL's error)
    table = Table(title="brokers")
    for column in ("broker", "state", "RabbitMQ", *(f"{q} ready/consumers" for q in queues)):
        table.add_column(escape(column))
    for b in brokers:
        state = "[green]up[/]" if b.up else f"[red]down[/] {escape(b.error or '')}"
        if b.consume_only:
            state += " (consume only)"
        cells = [
            "-" if depth is None else f"{depth[0]}/{depth[1]}"
            for depth in (b.queues.get(q) for q in queues)
        ]
        table.add_row(escape(b.name), state, escape(b.version or ""), *cells)
    console = Console()
    console.print(table)
    healthy = all(b.up for b in brokers)
    if redis_url:
        store = report.store(redis_url)
        if store.up:
            console.print(
                f"dedup store {escape(store.url)}: [green]up[/], {store.latency_ms} ms, "
                f"{store.keys} keys, {escape(str(store.used_memory))}"
            )
        else:
            console.print(
                f"dedup store {escape(store.url)}: [red]down[/] {escape(str(store.error))}"
            )
        healthy = healthy and store.up
    sys.exit(0 if healthy else 1)


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


def _register_operations() -> None:
    from celery_beetle.ops.cli import dead_letters, fleet, queues

    main.add_command(dead_letters)
    main.add_command(dead_letters, "dead")
    main.add_command(queues)
    from celery_beetle.outbox.cli import outbox, relay

    main.add_command(outbox)
    main.add_command(relay)
    main.add_command(fleet)


_register_operations()
