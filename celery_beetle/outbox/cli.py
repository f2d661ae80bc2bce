"""``beetle relay`` and ``beetle outbox init|list|retry|drop|sweep``: thin click commands over
:mod:`celery_beetle.outbox`. Registered on ``beetle`` by :mod:`celery_beetle.cli`.

The database URL comes from ``--db`` or ``$BEETLE_OUTBOX_DB`` (put URLs with passwords in
the environment, not on the command line, where ``ps`` shows them).
"""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

import click

__all__ = ["outbox", "relay"]

db_option = click.option(
    "--db",
    "db_url",
    envvar="BEETLE_OUTBOX_DB",
    required=True,
    help="The outbox's database URL, e.g. postgresql://u:p@host/db (or $BEETLE_OUTBOX_DB).",
)


def _engine(db_url: str) -> Any:
    """The database's engine; first in every command, so that a missing ``outbox`` extra
    is a message naming it rather than a traceback."""
    try:
        from celery_beetle.outbox.db import engine_for

        return engine_for(db_url)
    except ImportError as exc:
        raise click.ClickException(
            f"the outbox needs SQLAlchemy and psycopg ({exc}); install them with: "
            "pip install 'kombu-beetle[outbox]'"
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--db")


@click.command()
@db_option
@click.option(
    "--broker",
    "-b",
    "broker_url",
    envvar="BEETLE_BROKER_URL",
    help="The beetle:// URL of the brokers (or $BEETLE_BROKER_URL); default: the app's.",
)
@click.option("--app", "-A", "app_name", help="A Celery app (module:attribute): its broker and "
              "transport options (trace_dir, dedup_scopes, message_ttl).")  # fmt: skip
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(min=1))
@click.option("--trace-dir", help="Trace events here (overrides the app's beetle_trace_dir).")
@click.option("--once", is_flag=True, help="Relay what is due now, then exit.")
@click.option("--listen", is_flag=True, help="Wake on the enqueues' NOTIFY (they send it with "
              "beetle_outbox_notify = True) instead of polling alone.")  # fmt: skip
def relay(
    db_url: str,
    broker_url: str | None,
    app_name: str | None,
    batch_size: int,
    trace_dir: str | None,
    once: bool,
    listen: bool,
) -> None:
    """Relay committed outbox rows to the brokers (run as many as you like side by side)."""
    engine = _engine(db_url)
    from kombu import Connection

    import kombu_beetle  # noqa: F401  (registers beetle://)
    from celery_beetle.outbox.relay import Relay

    options: dict[str, Any] = {}
    if app_name:
        from celery.app.utils import find_app

        app = find_app(app_name)
        broker_url = broker_url or str(app.conf.broker_url or "")
        options = dict(app.conf.broker_transport_options or {})
        if app.conf.get("beetle_trace_dir"):
            options.setdefault("trace_dir", app.conf.beetle_trace_dir)
    if trace_dir:
        options["trace_dir"] = trace_dir
    if not broker_url or not broker_url.startswith("beetle://"):
        raise click.UsageError("the relay needs a beetle:// broker URL (--broker or the app's)")
    stop = threading.Event()
    with Connection(broker_url, transport_options=options) as conn:
        # bounded: --once gives up after seconds, a long-running relay after about two
        # minutes; each failed attempt is one line, and SIGTERM still ends the wait
        conn.ensure_connection(
            max_retries=2 if once else 30, interval_start=1, interval_step=1, interval_max=5,
            errback=lambda exc, interval: click.echo(
                f"beetle relay: brokers not reachable ({exc}); again in {interval:.0f} s",
                err=True,
            ),
        )  # fmt: skip
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        the_relay = Relay(engine, conn.channel(), batch_size=batch_size, listen=listen)
        if once:
            while not stop.is_set():
                result = the_relay.relay_once()
                if result.claimed < batch_size:
                    break
        else:
            click.echo(f"beetle relay: relaying {engine.url.render_as_string()} "
                       f"to {conn.as_uri()}", err=True)  # fmt: skip
            the_relay.run(stop)
    click.echo(json.dumps(the_relay.counts), err=True)


@click.group()
def outbox() -> None:
    """The transactional outbox's and inbox's tables: create them, list and retry rows set
    aside, sweep expired inbox rows."""


@outbox.command()
@db_option
@click.option(
    "--alembic",
    "use_alembic",
    is_flag=True,
    help="Run the shipped Alembic migration (version table beetle_outbox_alembic).",
)
def init(db_url: str, use_alembic: bool) -> None:
    """Create beetle_outbox, beetle_outbox_aside and beetle_inbox (the consumers' record of
    what they committed) if missing, and add the columns of later releases."""
    engine = _engine(db_url)
    if use_alembic:
        from celery_beetle.outbox.migrate import upgrade

        upgrade(engine)
    else:
        from celery_beetle.outbox.table import create_tables

        create_tables(engine)
    click.echo(f"outbox and inbox tables ready in {engine.url.render_as_string()}")


@outbox.command(name="list")
@db_option
@click.option("--json", "as_json", is_flag=True, help="JSON lines for scripts.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1))
def list_aside(db_url: str, as_json: bool, limit: int) -> None:
    """The rows set aside, with their reasons; and how many wait in the outbox."""
    engine = _engine(db_url)
    import sqlalchemy as sa

    from celery_beetle.outbox.relay import held_back
    from celery_beetle.outbox.table import ASIDE, OUTBOX

    with engine.connect() as conn:
        waiting = conn.execute(sa.select(sa.func.count()).select_from(OUTBOX)).scalar_one()
        rows = conn.execute(
            sa.select(
                ASIDE.c.id, ASIDE.c.task_name, ASIDE.c.routing_key, ASIDE.c.moved_at,
                ASIDE.c.reason, ASIDE.c.ordering_key,
            )
            .order_by(ASIDE.c.moved_at)
            .limit(limit)
        ).all()  # fmt: skip
        held = held_back(conn, {row.ordering_key for row in rows})
    if as_json:
        for row in rows:
            click.echo(json.dumps({**row._asdict(), "moved_at": row.moved_at.isoformat(),
                                   "holds_back": held.get(row.ordering_key, 0)}))  # fmt: skip
        return
    click.echo(f"{waiting} row(s) waiting to be relayed; {len(rows)} set aside")
    for row in rows:
        click.echo(f"{row.id}  {row.task_name}  -> {row.routing_key}  "
                   f"{row.moved_at:%Y-%m-%d %H:%M:%S}  {row.reason}")  # fmt: skip
        if row.ordering_key is not None:
            waiting_behind = held.get(row.ordering_key, 0)
            click.echo(f"    ordering key {row.ordering_key!r}: {waiting_behind} later row(s) "
                       f"wait for this one until it is retried or dropped "
                       f"(beetle outbox retry|drop {row.id})")  # fmt: skip


def _ids_option(f: Any) -> Any:
    return click.option("--id", "id_options", multiple=True, help="A row's id (repeatable).")(f)


@outbox.command()
@db_option
@click.argument("ids", nargs=-1)
@_ids_option
def drop(db_url: str, ids: tuple[str, ...], id_options: tuple[str, ...]) -> None:
    """Delete rows set aside for good (IDS, or --id): their tasks never run, and the later
    rows of their ordering keys go on. Exits 2 when an id is not set aside."""
    ids = (*ids, *id_options)
    if not ids:
        raise click.UsageError("name the rows to drop: IDS (or --id ID)")
    engine = _engine(db_url)
    from celery_beetle.outbox.relay import drop_aside

    dropped = drop_aside(engine, ids)
    for message_id in dropped:
        click.echo(f"dropped {message_id}")
    missing = set(ids) - set(dropped)
    if missing:
        raise click.UsageError(
            f"not set aside: {', '.join(sorted(missing))} (beetle outbox list shows the rows)"
        )


@outbox.command()
@db_option
@click.argument("ids", nargs=-1)
@_ids_option
@click.option("--all", "everything", is_flag=True, help="Every row set aside.")
@click.option("--message-ttl", default=86_400.0, show_default=True, type=click.FloatRange(min=1),
              help="The fresh expiry of a retried row, seconds.")  # fmt: skip
def retry(
    db_url: str, ids: tuple[str, ...], id_options: tuple[str, ...], everything: bool,
    message_ttl: float,
) -> None:  # fmt: skip
    """Put rows set aside back into the outbox, due now (IDS or --id, or --all). Exits 2
    when an id is not set aside."""
    ids = (*ids, *id_options)
    if not ids and not everything:
        raise click.UsageError("name the rows to retry (IDS) or give --all")
    if ids and everything:
        raise click.UsageError("give IDS or --all, not both")
    engine = _engine(db_url)
    from celery_beetle.outbox.relay import retry_aside

    moved = retry_aside(engine, ids, everything=everything, message_ttl_s=message_ttl)
    for message_id in moved:
        click.echo(f"requeued {message_id}")
    missing = set(ids) - set(moved)
    if missing:
        raise click.UsageError(
            f"not set aside (or being retried): {', '.join(sorted(missing))} "
            "(beetle outbox list shows the rows)"
        )


@outbox.command()
@db_option
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(min=1))
def sweep(db_url: str, batch_size: int) -> None:
    """Delete inbox rows past their dedup window (the relay does it once a minute)."""
    engine = _engine(db_url)
    from celery_beetle.outbox.inbox import sweep as sweep_inbox

    deleted = sweep_inbox(engine, batch_size=batch_size, max_batches=1_000_000)
    click.echo(f"deleted {deleted} expired inbox row(s)")
