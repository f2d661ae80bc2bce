"""``beetle status``: is every broker of a ``beetle://`` URL up, and the dedup store?

What it asks each of them: :mod:`celery_beetle.cli.report`; ``--watch`` shows the same live,
with the workers' verdicts from their metrics endpoints (:mod:`celery_beetle.cli.top`).
Exits 1 when a broker or the store is down, so it can serve as a health check.
"""

from __future__ import annotations

import sys

import click

from celery_beetle.cli import report
from celery_beetle.ops.cli_options import HiddenArgument, check_redis_url

__all__ = ["status"]


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
            "or give --broker or --broker-url-file"
        )
    return value or None


@click.command()
@click.option(
    "--broker",
    "-b",
    "broker_url",
    envvar="BEETLE_BROKER_URL",
    help="The beetle:// URL of the brokers (or $BEETLE_BROKER_URL).",
)
@click.argument("legacy_broker_url", required=False, cls=HiddenArgument)
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
@click.option("--json", "as_json", is_flag=True, help="JSON for scripts (not with --watch).")
def status(
    broker_url: str | None,
    legacy_broker_url: str | None,
    broker_url_file: str | None,
    redis_url: str | None,
    redis_url_file: str | None,
    queues: tuple[str, ...],
    watch: bool,
    metrics_urls: tuple[str, ...],
    as_json: bool,
) -> None:
    """Is every broker of the beetle:// URL (--broker) up, and the dedup store?

    Exits 1 when a broker or the store is down, so it can serve as a health check.
    --watch shows the same live, with the workers' verdict rates and dead letters
    from their --metrics endpoints.

    A URL given on the command line (--broker, --redis) is visible to every user of the
    machine through ps: pass URLs with passwords in BEETLE_BROKER_URL / BEETLE_REDIS_URL,
    or in files named by --broker-url-file / --redis-file (or BEETLE_BROKER_URL_FILE /
    BEETLE_REDIS_URL_FILE). Passwords are masked in the output.
    """
    if legacy_broker_url:
        click.echo(
            "warning: the broker URL as an argument is deprecated and will be refused in "
            "the next release: give it with --broker (or $BEETLE_BROKER_URL)",
            err=True,
        )
        broker_url = legacy_broker_url
    broker_url = _url_from(broker_url, broker_url_file, "broker", required=True)
    redis_url = _url_from(redis_url, redis_url_file, "dedup store", required=False)
    try:
        check_redis_url(None, None, redis_url)
    except click.BadParameter as exc:
        exc.param_hint = "--redis"
        raise
    assert broker_url is not None
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from kombu_beetle.errors import InvalidBrokerURL, InvalidTransportOption

    if metrics_urls and not watch:
        raise click.UsageError("--metrics goes with --watch")
    if as_json and watch:
        raise click.UsageError("--json is for one report, not with --watch")
    if watch:
        from celery_beetle.cli.top import watch as live_view

        try:
            live_view(broker_url, redis_url, queues, metrics_urls)
        except (InvalidBrokerURL, InvalidTransportOption) as exc:
            raise click.BadParameter(str(exc), param_hint="--broker")
        except KeyboardInterrupt:
            pass
        return
    try:
        reports = report.brokers(broker_url, queues)
    except (InvalidBrokerURL, InvalidTransportOption) as exc:
        raise click.BadParameter(str(exc), param_hint="--broker")
    if as_json:
        _print_json(reports, report.store(redis_url) if redis_url else None)
        return
    # names, versions and errors come from outside: escaped, so that rich shows their
    # brackets rather than reading them as markup ("[/db]" in a bad URL's error)
    table = Table(title="brokers")
    for column in ("broker", "state", "RabbitMQ", *(f"{q} ready/consumers" for q in queues)):
        table.add_column(escape(column))
    for b in reports:
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
    healthy = all(b.up for b in reports)
    if redis_url:
        found = report.store(redis_url)
        if found.up:
            console.print(
                f"dedup store {escape(found.url)}: [green]up[/], {found.latency_ms} ms, "
                f"{found.keys} keys, {escape(str(found.used_memory))}"
            )
        else:
            console.print(
                f"dedup store {escape(found.url)}: [red]down[/] {escape(str(found.error))}"
            )
        healthy = healthy and found.up
    sys.exit(0 if healthy else 1)


def _print_json(reports: list[report.BrokerStatus], found: report.StoreStatus | None) -> None:
    """The same report as one JSON document; exit 1 when a broker or the store is down."""
    import json
    from dataclasses import asdict

    brokers = [
        {**asdict(b), "queues": {q: None if d is None else {"ready": d[0], "consumers": d[1]}
                                 for q, d in b.queues.items()}}
        for b in reports
    ]  # fmt: skip
    store = asdict(found) if found is not None else None
    click.echo(json.dumps({"brokers": brokers, "store": store}, indent=2))
    healthy = all(b.up for b in reports) and (found is None or found.up)
    sys.exit(0 if healthy else 1)
