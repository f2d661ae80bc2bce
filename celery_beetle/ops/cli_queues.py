"""``beetle queues`` (plan, apply and migrate queue properties on every broker, over
:mod:`.policies` and :mod:`.migrate`) and ``beetle fleet`` (every consumer on every broker,
:mod:`.fleet`).

Exit status: 0 when done; 1 when a broker could not be read; 2 for usage errors, for
``beetle queues plan`` when a broker differs from the configuration (drift), and for
``beetle fleet`` when it flags a consumer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from celery_beetle.ops.cli_options import (
    HiddenArgument,
    broker_option,
    chosen_queue,
    fail_on_bad_url,
    json_option,
    prefix_option,
    queue_option,
    redis_option,
    report_errors,
)

__all__ = ["fleet", "queues"]

EXIT_FLAGGED = 2

EXIT_DRIFT = 2


@click.group("queues")
def queues() -> None:
    """Queue properties as RabbitMQ policies on every broker: plan, apply."""


def _policy_inputs(config_path: str, names: tuple[str, ...]) -> tuple[Any, list[str]]:
    from celery_beetle.ops.policies import PolicyConfig

    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {config_path}: {exc.strerror}", param_hint="--config"
        )
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise click.BadParameter(
            f"{config_path} is not JSON ({exc}); expected "
            '{"default": {...}, "queues": {"name": {...}}}',
            param_hint="--config",
        )
    try:
        config = PolicyConfig.from_mapping(raw)
    except (ValueError, TypeError, AttributeError) as exc:
        raise click.BadParameter(f"{config_path}: {exc}", param_hint="--config")
    wanted = list(names) or sorted(config.queues)
    if not wanted:
        raise click.UsageError("no queues: name them with -Q, or list them in the config")
    return config, wanted


def management_api_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--management-port``, ``--management-tls`` and ``--management-url``: how to reach
    each broker's management API (:func:`_clients`), the same for every command that uses it."""
    f = click.option(
        "--management-url",
        "management_urls",
        multiple=True,
        metavar="HOST:PORT=URL",
        help="The API of one broker, e.g. rabbit1:5672=https://rabbit1:15671 (repeatable).",
    )(f)
    f = click.option("--management-tls", is_flag=True, help="https to the management API.")(f)
    return click.option(
        "--management-port", default=15672, show_default=True, help="On every broker."
    )(f)


def _management_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            "--config",
            "config_path",
            required=True,
            type=click.Path(exists=True, dir_okay=False),
            help='JSON: {"default": {...}, "queues": {"name": {...}}} (beetle_queue_policies).',
        ),
        click.option("--queue", "-Q", "names", multiple=True, help="Only this queue."),
        management_api_options,
        broker_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _clients(broker_url: str, port: int, tls: bool, urls: tuple[str, ...]) -> list[Any]:
    from celery_beetle.ops.management import ManagementConfig, clients_for_url

    by_broker = {}
    for item in urls:
        broker, sep, url = item.partition("=")
        if not sep or not url:
            raise click.BadParameter(
                f"{item!r}: expected HOST:PORT=URL", param_hint="--management-url"
            )
        by_broker[broker] = url
    config = ManagementConfig(port=port, scheme="https" if tls else "http", urls=by_broker)
    return list(fail_on_bad_url(lambda: clients_for_url(broker_url, config)))


@queues.command("plan")
@_management_options
def plan_command(
    config_path: str, names: tuple[str, ...], management_port: int, management_tls: bool,
    management_urls: tuple[str, ...], broker_url: str,
) -> None:  # fmt: skip
    """What differs between the configuration and each broker; exit 2 on drift."""
    from celery_beetle.ops.policies import plan

    config, wanted = _policy_inputs(config_path, names)
    plans = plan(
        _clients(broker_url, management_port, management_tls, management_urls), wanted, config
    )
    drift = _print_plans(plans)
    sys.exit(1 if any(p.error for p in plans) else EXIT_DRIFT if drift else 0)


@queues.command("apply")
@_management_options
def apply_command(
    config_path: str, names: tuple[str, ...], management_port: int, management_tls: bool,
    management_urls: tuple[str, ...], broker_url: str,
) -> None:  # fmt: skip
    """Make every broker match the configuration (writes only what differs)."""
    from celery_beetle.ops.policies import apply

    config, wanted = _policy_inputs(config_path, names)
    plans = apply(
        _clients(broker_url, management_port, management_tls, management_urls), wanted, config
    )
    _print_plans(plans)
    click.echo(f"{sum(p.writes for p in plans)} write(s)")
    sys.exit(1 if any(p.error for p in plans) else 0)


def _print_plans(plans: list[Any]) -> bool:
    drift = False
    for p in plans:
        if p.error:
            click.echo(f"{p.broker}: unreachable: {p.error}")
            continue
        if not p.changes and not p.drift:
            click.echo(f"{p.broker}: up to date")
        for change in p.changes:
            drift = True
            click.echo(change.describe())
        for item in p.drift:
            click.echo(f"warning: {item.describe()}")
    return drift


@queues.command("migrate")
@queue_option
@click.argument("legacy_queue", required=False, cls=HiddenArgument)
@click.option(
    "--queue-type",
    type=click.Choice(["classic", "quorum"]),
    default=None,
    help="The queue type to migrate to.",
)
@click.option(
    "--arg",
    "args",
    multiple=True,
    metavar="x-NAME=VALUE",
    help="An x-argument to set (x-NAME= removes it); repeatable.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--status", "show_status", is_flag=True, help="Where the queue's migration stands.")
@click.option("--resume", is_flag=True, help="Go on with a migration that stopped.")
@click.option(
    "--no-workers",
    is_flag=True,
    help="Do not ask the workers (Celery remote control) to consume the temporary queue.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Start although plain, older or unidentified consumers consume QUEUE (see beetle fleet).",
)
@management_api_options
@click.option(
    "--settle-s",
    default=5.5,
    hidden=True,
    help="How long the API must show a temporary queue unused (its statistics interval).",
)
@broker_option
@redis_option
@prefix_option
def migrate_command(
    queue: str | None, legacy_queue: str | None, queue_type: str | None,
    args: tuple[str, ...], dry_run: bool, show_status: bool, resume: bool, no_workers: bool,
    force: bool, management_port: int,
    management_tls: bool, management_urls: tuple[str, ...], settle_s: float, broker_url: str,
    redis_url: str, key_prefix: str,
) -> None:  # fmt: skip
    """Change what no policy can (queue type, x-max-priority, any x-argument) of the queue
    (-Q QUEUE) on every broker, live: through QUEUE.beetle-migrating, one broker at a time,
    the state kept in the dedup store (--status, --resume). See celery_beetle.ops.migrate."""
    from celery_beetle.ops.migrate import (
        CeleryControl,
        MigrationError,
        Migrator,
        StateStore,
        parse_arguments,
    )
    from celery_beetle.store import connect
    from kombu_beetle.options import build_options

    queue, _ = chosen_queue(queue, (legacy_queue,) if legacy_queue else (), "queues migrate QUEUE")
    options = fail_on_bad_url(lambda: build_options(broker_url))
    store = StateStore(connect(redis_url), key_prefix)
    saved = store.load(options.virtual_host, queue)
    if show_status:
        click.echo(saved.describe() if saved else f"no migration of {queue!r} on record")
        sys.exit(0 if saved is None or saved.done else 3)
    if saved is not None and not saved.done and not resume:
        click.echo(saved.describe(), err=True)
        raise click.UsageError(f"a migration of {queue!r} is under way: --resume it")
    try:
        changes = parse_arguments(args)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--arg")
    clients = _clients(broker_url, management_port, management_tls, management_urls)
    lock = store.lock(options.virtual_host, queue)
    control = None
    try:
        if not dry_run:
            lock.acquire(wait_s=15.0, echo=click.echo)
            saved = store.load(options.virtual_host, queue)  # as the previous holder left it
            if saved is not None and not saved.done and not resume:
                raise click.UsageError(f"a migration of {queue!r} is under way: --resume it")
            control = None if no_workers else CeleryControl(broker_url)
        migrator = Migrator(
            options, clients, store, control, echo=click.echo, settle_s=settle_s,
            lock=None if dry_run else lock,
        )  # fmt: skip
        if resume:
            if saved is None or saved.done:
                raise click.UsageError(f"no migration of {queue!r} to resume")
            state = saved
        else:
            if not (queue_type or changes):
                raise click.UsageError("say what to change: --queue-type and/or --arg")
            state = migrator.plan(queue, queue_type, changes)
            click.echo(migrator.describe_plan(state))
            _refuse_unsafe_consumers(clients, queue, force)
            if dry_run:
                click.echo("dry run: nothing changed")
                return
            store.save(state, lock)
        migrator.run(state)
    except MigrationError as exc:
        raise click.ClickException(str(exc))
    finally:
        lock.release()
        if control is not None:
            control.close()
    click.echo(state.describe())


@click.command("fleet")
@click.option("--queue", "-Q", "names", multiple=True, help="Only this queue (repeatable).")
@click.option(
    "--min-version",
    default=None,
    help="Flag beetle consumers older than this (default: this beetle's version).",
)
@management_api_options
@broker_option
@json_option
def fleet(
    names: tuple[str, ...], min_version: str | None, management_port: int,
    management_tls: bool, management_urls: tuple[str, ...], broker_url: str, as_json: bool,
) -> None:  # fmt: skip
    """Every consumer of every task queue on every broker: beetle, older beetle or plain.

    Exits 2 while a plain (non-beetle), older or unidentified consumer remains, 1 when a
    broker could not be read, so that a deploy pipeline can wait before it switches
    publishers to beetle:// (a plain worker would run both copies of a redundant message)."""
    from dataclasses import asdict

    from celery_beetle.ops.fleet import survey

    clients = _clients(broker_url, management_port, management_tls, management_urls)
    report = survey(clients, names, min_version)
    if report.errors and len(report.errors) >= len(clients):
        report_errors(report.errors)
        raise click.ClickException(
            "no broker's management API could be read (above), so nothing can be said "
            "about the consumers; check that the management plugin is enabled and reachable "
            "(--management-port, --management-tls, --management-url) and the URL's user "
            "and password"
        )
    if as_json:
        click.echo(json.dumps([asdict(c) for c in report.consumers], indent=2))
    else:
        click.echo(_consumer_table(report.consumers), nl=False)
        flagged = report.flagged
        click.echo(
            f"{len(report.consumers)} consumer(s), {len(flagged)} flagged "
            f"(plain: {sum(c.kind == 'plain' for c in flagged)}, "
            f"older than {report.minimum}: {sum(c.kind == 'older' for c in flagged)}, "
            f"unknown: {sum(c.kind == 'unknown' for c in flagged)})"
        )
    report_errors(report.errors)
    sys.exit(1 if report.errors else EXIT_FLAGGED if report.flagged else 0)


def _consumer_table(consumers: list[Any]) -> str:
    """The consumers as text columns, each as wide as its widest cell."""
    rows = [("kind", "broker", "queue", "client", "peer")]
    rows += [(c.kind, c.broker, c.queue, f"{c.product} {c.version}", c.peer) for c in consumers]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        + "\n"
        for row in rows
    )


def _refuse_unsafe_consumers(clients: list[Any], queue: str, force: bool) -> None:
    """A plain worker, or a beetle worker older than the temporary queue's shared scope,
    would consume QUEUE.beetle-migrating under a scope of its own: a message with copies in
    both queues could run twice. Refuse, unless --force."""
    from celery_beetle.ops.fleet import survey
    from kombu_beetle.scopes import migrating_queue

    report = survey(clients, [queue, migrating_queue(queue)])
    if not report.flagged:
        return
    for consumer in report.flagged:
        click.echo(f"  {consumer.describe()}", err=True)
    message = (
        f"{len(report.flagged)} consumer(s) of {queue} are plain, unknown or older than "
        f"{report.minimum}: they would not share the temporary queue's dedup scope"
    )
    if not force:
        raise click.ClickException(message + " (upgrade them first, or --force)")
    click.echo(f"warning: {message} (--force)", err=True)
