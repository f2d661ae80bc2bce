"""``beetle dead-letters`` (alias ``beetle dead``): list, show, replay and purge the dead
letters of a queue on every broker, over :mod:`.dead_letters` and :mod:`.replay`.

The grammar of every subcommand: the queue is ``-Q QUEUE``; message ids are positional or
``--id`` (repeatable), whole or a unique prefix, as the listing shows them. The old spelling
with the queue as the first argument still works, with a deprecation warning.

Exit status: 0 when done; 1 when a broker could not be read or a replay failed; 2 for usage
errors, an unknown queue and an id that names no dead letter (or more than one).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from celery_beetle.ops.cli_options import (
    HiddenArgument,
    broker_option,
    check_redis_url,
    chosen_queue,
    fail_on_bad_url,
    json_option,
    prefix_option,
    queue_option,
    redis_option,
    report_errors,
    when,
)

__all__ = ["dead_letters"]


@click.group("dead-letters")
def dead_letters() -> None:
    """List, inspect, replay and purge the dead letters of a queue (<queue>.dead on every
    broker): beetle dead-letters list -Q QUEUE."""


def ids_arguments(f: Any) -> Any:
    """``-Q QUEUE``, ``[ID]...`` and ``--id ID``: the queue and the message ids named."""
    f = click.option(
        "--id", "id_options", multiple=True, help="A message id or a unique prefix (repeatable)."
    )(f)
    f = click.argument("positionals", nargs=-1, metavar="[ID]...")(f)
    return queue_option(f)


def _queue_and_ids(
    queue: str | None, positionals: tuple[str, ...], id_options: tuple[str, ...], command: str
) -> tuple[str, tuple[str, ...]]:
    queue, ids = chosen_queue(queue, positionals, f"dead-letters {command} QUEUE")
    return queue, (*ids, *id_options)


@dead_letters.command("list")
@queue_option
@click.argument("legacy_queue", required=False, cls=HiddenArgument)
@broker_option
@click.option(
    "--redis",
    "redis_url",
    envvar="BEETLE_REDIS_URL",
    default=None,
    callback=check_redis_url,
    help="The dedup store's URL (or $BEETLE_REDIS_URL): with it, a column says what a "
    "replay would do with each entry, and why it would refuse one.",
)
@prefix_option
@json_option
def list_command(
    queue: str | None,
    legacy_queue: str | None,
    broker_url: str,
    redis_url: str | None,
    key_prefix: str,
    as_json: bool,
) -> None:
    """The dead letters of the queue, one line per message however many brokers hold it.

    The table shows each id by its shortest unique prefix (at least 8 characters), which
    show, replay and purge accept; --json gives the whole ids."""
    from celery_beetle.ops.dead_letters import list_dead_letters, short_ids

    queue, _ = chosen_queue(
        queue, (legacy_queue,) if legacy_queue else (), "dead-letters list QUEUE"
    )
    letters, errors = fail_on_bad_url(lambda: list_dead_letters(broker_url, queue))
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

        short = short_ids(letters)
        table = Table(title=escape(f"{queue}.dead: {len(letters)} dead letter(s)"))
        width = max((len(text) for text in short.values()), default=2)
        table.add_column("id", no_wrap=True, min_width=width)
        for column in ("task", "reason", "exception", "attempts", "when (UTC)"):
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
                short.get(d.message_id or "", "-"),
                d.task or "-",
                d.reason,
                exception or "-",
                str(s["attempts"] if s["attempts"] is not None else "-"),
                when(d.dead_at_ms),
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
    report_errors(errors)
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
@ids_arguments
@broker_option
def show_command(
    queue: str | None, positionals: tuple[str, ...], id_options: tuple[str, ...], broker_url: str
) -> None:
    """Everything about the dead letter(s) of each ID in the queue, arguments included."""
    from celery_beetle.ops.dead_letters import list_dead_letters, resolve_ids

    queue, ids = _queue_and_ids(queue, positionals, id_options, "show")
    if not ids:
        raise click.UsageError("name the dead letter: ID (or --id ID)")
    letters, errors = fail_on_bad_url(lambda: list_dead_letters(broker_url, queue))
    report_errors(errors)
    wanted = set(resolve_ids(letters, ids, queue))
    found = [d.details() for d in letters if d.message_id in wanted]
    click.echo(json.dumps(found[0] if len(found) == 1 else found, indent=2, default=str))
    sys.exit(1 if errors else 0)


@dead_letters.command("replay")
@ids_arguments
@click.option("--task", "task", default=None, help="Replay every dead letter of this task.")
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter of the queue.")
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
    queue: str | None,
    positionals: tuple[str, ...],
    id_options: tuple[str, ...],
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
    """Publish dead letters of the queue back to it, redundantly, so that each runs once.

    A message whose record is completed is not run again; one with a copy in flight is
    left; one that may have completed (no record, past its dedup window) is refused unless
    --force. Running it again after an interruption is safe: see celery_beetle.ops.replay.
    Exit status 1 when a replay failed or was refused.
    """
    from celery_beetle.ops.replay import replay
    from celery_beetle.store import RedisStore
    from kombu_beetle.trace import flush_all, get_tracer

    queue, ids = _queue_and_ids(queue, positionals, id_options, "replay")
    if not (ids or task or everything):
        raise click.UsageError("name what to replay: ID (or --id ID), --task NAME or --all")
    store = RedisStore.from_url(redis_url, key_prefix=key_prefix)
    errors: dict[str, str] = {}
    try:
        results = fail_on_bad_url(
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
                errors=errors,
            )
        )
    except LookupError:
        raise
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
    report_errors(errors)
    failed = any(r.outcome in ("failed", "refused") for r in results)
    sys.exit(1 if failed or errors else 0)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _age_s(text: str) -> float:
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not number.replace(".", "", 1).isdigit():
        raise click.BadParameter(
            f"{text!r}: expected a number and s, m, h or d (e.g. 7d)", param_hint="--older-than"
        )
    return float(number) * _UNITS[unit]


@dead_letters.command("purge")
@ids_arguments
@click.option("--task", "task", default=None, help="Purge the dead letters of this task.")
@click.option("--older-than", "older_than", default=None, help="Only those dead for longer: 7d.")
@click.option("--all", "everything", is_flag=True, help="Purge every dead letter of the queue.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@broker_option
def purge_command(
    queue: str | None,
    positionals: tuple[str, ...],
    id_options: tuple[str, ...],
    task: str | None,
    older_than: str | None,
    everything: bool,
    yes: bool,
    broker_url: str,
) -> None:
    """Remove dead letters of the queue from every broker: only those named."""
    import time

    from celery_beetle.ops.dead_letters import purge

    queue, ids = _queue_and_ids(queue, positionals, id_options, "purge")
    if not (ids or task or everything or older_than):
        raise click.UsageError(
            "name what to purge: ID (or --id ID), --task NAME, --older-than AGE, --all"
        )
    before = None if older_than is None else int((time.time() - _age_s(older_than)) * 1000)
    named: dict[str, Any] = {
        "ids": ids,
        "task": task,
        "everything": everything,
        "dead_before_ms": before,
    }
    chosen = fail_on_bad_url(lambda: purge(broker_url, queue, dry_run=True, **named))
    if not chosen:
        click.echo("nothing to purge")
        return
    for letter in chosen:
        click.echo(
            f"{letter.message_id}  {letter.task}  {letter.reason}  {when(letter.dead_at_ms)}"
        )
    if not yes:
        click.confirm(f"remove these {len(chosen)} dead letter(s) from every broker?", abort=True)
    removed = purge(broker_url, queue, **named)
    click.echo(f"{len(removed)} dead letter(s) removed")
