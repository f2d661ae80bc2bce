"""``beetle dead-letters`` (alias ``beetle dead``) and ``beetle queues``: thin click
commands over :mod:`celery_beetle.ops`. Registered on ``beetle`` by
:mod:`celery_beetle.cli`; heavy imports wait inside each command.

Exit status: 0 when done; 1 when a broker could not be read or a replay failed; 2 for usage
errors, and for ``beetle queues plan`` when a broker differs from the configuration (drift).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import click

__all__ = ["dead_letters", "fleet", "queues"]

EXIT_FLAGGED = 2

EXIT_DRIFT = 2

broker_option = click.option(
    "--broker",
    "-b",
    "broker_url",
    envvar="BEETLE_BROKER_URL",
    required=True,
    help="The beetle:// URL of the brokers (or $BEETLE_BROKER_URL).",
)
redis_option = click.option(
    "--redis",
    "redis_url",
    envvar="BEETLE_REDIS_URL",
    required=True,
    help="The dedup store's URL (or $BEETLE_REDIS_URL).",
)
prefix_option = click.option(
    "--key-prefix", default="beetle:", show_default=True, help="beetle_key_prefix of the workers."
)
json_option = click.option("--json", "as_json", is_flag=True, help="JSON for scripts.")


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _fail_on_bad_url(call: Callable[[], Any]) -> Any:
    from kombu_beetle.errors import InvalidBrokerURL, InvalidTransportOption

    try:
        return call()
    except (InvalidBrokerURL, InvalidTransportOption) as exc:
        raise click.BadParameter(str(exc), param_hint="--broker")


def _report_errors(errors: dict[str, str]) -> None:
    for broker, error in errors.items():
        click.echo(f"broker {broker} could not be read: {error}", err=True)


@click.group("dead-letters")
def dead_letters() -> None:
    """List, inspect and replay the dead letters of a queue (<queue>.dead on every broker)."""


@dead_letters.command("list")
@click.argument("queue")
@broker_option
@click.option(
    "--redis",
    "redis_url",
    envvar="BEETLE_REDIS_URL",
    default=None,
    help="The dedup store's URL (or $BEETLE_REDIS_URL): with it, a column says what a "
    "replay would do with each entry, and why it would refuse one.",
)
@prefix_option
@json_option
def list_command(
    queue: str, broker_url: str, redis_url: str | None, key_prefix: str, as_json: bool
) -> None:
    """The dead letters of QUEUE, one line per message however many brokers hold it."""
    from celery_beetle.ops.dead_letters import list_dead_letters

    letters, errors = _fail_on_bad_url(lambda: list_dead_letters(broker_url, queue))
    verdicts = _previews(letters, redis_url, key_prefix)
    if as_json:
        rows = [d.summary() for d in letters]
        for row, verdict in zip(rows, verdicts, strict=False):  # none without a store
            row.update(replay=verdict.outcome, replay_reason=verdict.detail)
        click.echo(json.dumps(rows, indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=escape(f"{queue}.dead: {len(letters)} dead letter(s)"))
        for column in ("message id", "task", "reason", "exception", "attempts", "when (UTC)"):
            table.add_column(column)
        table.add_column("brokers")
        if verdicts:
            table.add_column("replay", no_wrap=True, min_width=12)
        notes: list[str] = []
        for index, d in enumerate(letters):
            s = d.summary()
            exception = (s["exception"] or "").rsplit(".", 1)[-1]
            if s["message"]:
                exception = f"{exception}: {s['message'][:60]}" if exception else s["message"][:60]
            row = [
                d.message_id or "-",
                d.task or "-",
                d.reason,
                exception or "-",
                str(s["attempts"] if s["attempts"] is not None else "-"),
                _when(d.dead_at_ms),
                ", ".join(d.brokers),
            ]
            if verdicts:
                verdict = verdicts[index]
                if verdict.outcome == "refused":
                    notes.append(f"[{len(notes) + 1}] {d.message_id}: refused, {verdict.detail}")
                    row.append(f"refused [{len(notes)}]")
                else:
                    row.append(_VERDICT_CELLS.get(verdict.outcome, verdict.outcome))
            table.add_row(*(escape(cell) for cell in row))
        Console().print(table)
        for note in notes:  # plain text: a reason is too long for a cell
            click.echo(note)
    _report_errors(errors)
    sys.exit(1 if errors else 0)


def _previews(letters: list[Any], redis_url: str | None, key_prefix: str) -> list[Any]:
    """What a replay would do with each dead letter (empty without a store to ask)."""
    if not redis_url or not letters:
        return []
    from celery_beetle.ops.replay import preview
    from celery_beetle.store import RedisStore

    store = RedisStore.from_url(redis_url, key_prefix=key_prefix)
    try:
        return [preview(store, letter) for letter in letters]
    finally:
        store.close()


#: the "replay" column of ``dead list``: what a replay would do
_VERDICT_CELLS = {
    "run": "runs it",
    "republish": "publishes again",
    "done": "removes it",
    "completed": "removes it",
    "in_flight": "leaves it",
    "skipped": "skips it",
}


@dead_letters.command("show")
@click.argument("queue")
@click.argument("message_id")
@broker_option
def show_command(queue: str, message_id: str, broker_url: str) -> None:
    """Everything about the dead letter(s) of MESSAGE_ID in QUEUE, arguments included."""
    from celery_beetle.ops.dead_letters import list_dead_letters

    letters, errors = _fail_on_bad_url(lambda: list_dead_letters(broker_url, queue))
    found = [d.details() for d in letters if d.message_id == message_id]
    _report_errors(errors)
    if not found:
        click.echo(f"no dead letter of {message_id} in {queue}.dead", err=True)
        sys.exit(1)
    click.echo(json.dumps(found[0] if len(found) == 1 else found, indent=2, default=str))
    sys.exit(1 if errors else 0)


@dead_letters.command("replay")
@click.argument("queue")
@click.option("--id", "ids", multiple=True, help="Replay this message id (repeatable).")
@click.option("--task", "task", default=None, help="Replay every dead letter of this task.")
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter of QUEUE.")
@click.option("--dry-run", is_flag=True, help="Say what would happen; change nothing.")
@click.option(
    "--force",
    is_flag=True,
    help="Also run what the store cannot prove did not complete (refused otherwise, with "
    "the reason: past its dedup window, a twin or an earlier replay may have completed).",
)
@click.option(
    "--trace-dir",
    envvar="BEETLE_TRACE_DIR",
    default=None,
    help="Write a 'replayed' trace event per replay here (the workers' beetle_trace_dir), "
    "so that beetle audit counts replayed messages as replayed.",
)
@broker_option
@redis_option
@prefix_option
@json_option
def replay_command(
    queue: str,
    ids: tuple[str, ...],
    task: str | None,
    everything: bool,
    dry_run: bool,
    force: bool,
    trace_dir: str | None,
    broker_url: str,
    redis_url: str,
    key_prefix: str,
    as_json: bool,
) -> None:
    """Publish dead letters of QUEUE back to it, redundantly, so that each runs once.

    A message whose record is completed is not run again; one with a copy in flight is
    left; one that may have completed (no record, past its dedup window) is refused unless
    --force. Running it again after an interruption is safe: see celery_beetle.ops.replay.
    Exit status 1 when a replay failed or was refused.
    """
    from celery_beetle.ops.replay import replay
    from celery_beetle.store import RedisStore
    from kombu_beetle.trace import flush_all, get_tracer

    if not (ids or task or everything):
        raise click.UsageError("name what to replay: --id ID, --task NAME or --all")
    store = RedisStore.from_url(redis_url, key_prefix=key_prefix)
    try:
        results = _fail_on_bad_url(
            lambda: replay(
                broker_url,
                queue,
                store,
                ids=ids,
                task=task,
                everything=everything,
                dry_run=dry_run,
                force=force,
                tracer=get_tracer(trace_dir, role="ops"),
            )
        )
    except ValueError as exc:
        raise click.ClickException(str(exc))
    finally:
        store.close()
        flush_all()
    rows = [
        {
            "message_id": r.letter.message_id,
            "task": r.letter.task,
            "outcome": r.outcome,
            "removed": r.acked,
            "detail": r.detail,
        }
        for r in results
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for row in rows:
            click.echo(f"{row['message_id']}  {row['task']}  {row['outcome']}: {row['detail']}")
        click.echo(f"{len(rows)} dead letter(s){' (dry run)' if dry_run else ''}")
    sys.exit(1 if any(r.outcome in ("failed", "refused") for r in results) else 0)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _age_s(text: str) -> float:
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not number.replace(".", "", 1).isdigit():
        raise click.BadParameter(f"{text!r}: expected a number and s, m, h or d (e.g. 7d)")
    return float(number) * _UNITS[unit]


@dead_letters.command("purge")
@click.argument("queue")
@click.option("--id", "ids", multiple=True, help="Purge this message id (repeatable).")
@click.option("--task", "task", default=None, help="Purge the dead letters of this task.")
@click.option("--older-than", "older_than", default=None, help="Only those dead for longer: 7d.")
@click.option("--all", "everything", is_flag=True, help="Purge every dead letter of QUEUE.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@broker_option
def purge_command(
    queue: str,
    ids: tuple[str, ...],
    task: str | None,
    older_than: str | None,
    everything: bool,
    yes: bool,
    broker_url: str,
) -> None:
    """Remove dead letters of QUEUE from every broker: only those named."""
    import time

    from celery_beetle.ops.dead_letters import purge

    if not (ids or task or everything or older_than):
        raise click.UsageError("name what to purge: --id ID, --task NAME, --older-than AGE, --all")
    before = None if older_than is None else int((time.time() - _age_s(older_than)) * 1000)
    named: dict[str, Any] = {
        "ids": ids,
        "task": task,
        "everything": everything,
        "dead_before_ms": before,
    }
    chosen = _fail_on_bad_url(lambda: purge(broker_url, queue, dry_run=True, **named))
    if not chosen:
        click.echo("nothing to purge")
        return
    for letter in chosen:
        click.echo(
            f"{letter.message_id}  {letter.task}  {letter.reason}  {_when(letter.dead_at_ms)}"
        )
    if not yes:
        click.confirm(f"remove these {len(chosen)} dead letter(s) from every broker?", abort=True)
    removed = purge(broker_url, queue, **named)
    click.echo(f"{len(removed)} dead letter(s) removed")


@click.group("queues")
def queues() -> None:
    """Queue properties as RabbitMQ policies on every broker: plan, apply."""


def _policy_inputs(config_path: str, names: tuple[str, ...]) -> tuple[Any, list[str]]:
    from celery_beetle.ops.policies import PolicyConfig

    with open(config_path) as f:
        raw = json.load(f)
    try:
        config = PolicyConfig.from_mapping(raw)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--config")
    wanted = list(names) or sorted(config.queues)
    if not wanted:
        raise click.UsageError("no queues: name them with -Q, or list them in the config")
    return config, wanted


def _management_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "--config",
                "config_path",
                required=True,
                type=click.Path(exists=True, dir_okay=False),
                help='JSON: {"default": {...}, "queues": {"name": {...}}} (beetle_queue_policies).',
            ),
            click.option("--queue", "-Q", "names", multiple=True, help="Only this queue."),
            click.option(
                "--management-port", default=15672, show_default=True, help="On every broker."
            ),
            click.option("--management-tls", is_flag=True, help="https to the management API."),
            click.option(
                "--management-url",
                "management_urls",
                multiple=True,
                metavar="HOST:PORT=URL",
                help="The API of one broker, e.g. rabbit1:5672=https://rabbit1:15671 (repeatable).",
            ),
            broker_option,
        ]
    ):
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
    return list(_fail_on_bad_url(lambda: clients_for_url(broker_url, config)))


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
@click.argument("queue", required=False)
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
@click.option("--status", "show_status", is_flag=True, help="Where the migration of QUEUE stands.")
@click.option("--resume", is_flag=True, help="Go on with a migration that stopped.")
@click.option(
    "--no-workers",
    is_flag=True,
    help="Do not ask the workers (Celery remote control) to consume the temporary queue.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Start although plain or older consumers consume QUEUE (see beetle fleet).",
)
@click.option("--management-port", default=15672, show_default=True, help="On every broker.")
@click.option("--management-tls", is_flag=True, help="https to the management API.")
@click.option(
    "--management-url",
    "management_urls",
    multiple=True,
    metavar="HOST:PORT=URL",
    help="The API of one broker, e.g. rabbit1:5672=https://rabbit1:15671 (repeatable).",
)
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
    queue: str | None, queue_type: str | None, args: tuple[str, ...], dry_run: bool,
    show_status: bool, resume: bool, no_workers: bool, force: bool, management_port: int,
    management_tls: bool, management_urls: tuple[str, ...], settle_s: float, broker_url: str,
    redis_url: str, key_prefix: str,
) -> None:  # fmt: skip
    """Change what no policy can (queue type, x-max-priority, any x-argument) of QUEUE on
    every broker, live: through QUEUE.beetle-migrating, one broker at a time, the state
    kept in the dedup store (--status, --resume). See celery_beetle.ops.migrate."""
    from celery_beetle.ops.migrate import (
        CeleryControl,
        MigrationError,
        Migrator,
        StateStore,
        parse_arguments,
    )
    from celery_beetle.store import connect
    from kombu_beetle.options import build_options

    if not queue:
        raise click.UsageError("name the QUEUE to migrate")
    options = _fail_on_bad_url(lambda: build_options(broker_url))
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
@click.option("--management-port", default=15672, show_default=True, help="On every broker.")
@click.option("--management-tls", is_flag=True, help="https to the management API.")
@click.option(
    "--management-url",
    "management_urls",
    multiple=True,
    metavar="HOST:PORT=URL",
    help="The API of one broker, e.g. rabbit1:5672=https://rabbit1:15671 (repeatable).",
)
@broker_option
@json_option
def fleet(
    names: tuple[str, ...], min_version: str | None, management_port: int,
    management_tls: bool, management_urls: tuple[str, ...], broker_url: str, as_json: bool,
) -> None:  # fmt: skip
    """Every consumer of every task queue on every broker: beetle, older beetle or plain.

    Exits 2 while a plain (non-beetle) or older consumer remains, 1 when a broker could not
    be read, so that a deploy pipeline can wait before it switches publishers to beetle://
    (a plain worker would run both copies of a redundant message)."""
    from dataclasses import asdict

    from celery_beetle.ops.fleet import survey

    clients = _clients(broker_url, management_port, management_tls, management_urls)
    report = survey(clients, names, min_version)
    if as_json:
        click.echo(json.dumps([asdict(c) for c in report.consumers], indent=2))
    else:
        click.echo(f"{'kind':<6}  broker  queue  client  peer")
        for consumer in report.consumers:
            click.echo(consumer.describe())
        flagged = report.flagged
        click.echo(
            f"{len(report.consumers)} consumer(s), {len(flagged)} flagged "
            f"(plain: {sum(c.kind == 'plain' for c in flagged)}, "
            f"older than {report.minimum}: {sum(c.kind == 'older' for c in flagged)})"
        )
    _report_errors(report.errors)
    sys.exit(1 if report.errors else EXIT_FLAGGED if report.flagged else 0)


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
        f"{len(report.flagged)} consumer(s) of {queue} are plain or older than "
        f"{report.minimum}: they would not share the temporary queue's dedup scope"
    )
    if not force:
        raise click.ClickException(message + " (upgrade them first, or --force)")
    click.echo(f"warning: {message} (--force)", err=True)
