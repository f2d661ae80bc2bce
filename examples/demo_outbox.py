"""The demo's outbox part: orders committed with their tasks, one rolled back, the relay
killed halfway; every committed order charged once, the rolled-back one never.

Runs on the demo's database: a local throwaway PostgreSQL (:func:`database`) unless
``BEETLE_OUTBOX_DB`` names one (its tables ``beetle_outbox``, ``beetle_outbox_aside``,
``beetle_inbox``, ``demo_charges`` and ``demo_orders`` are created if missing). Called by
``examples/demo.py`` while its workers run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from examples.demo_charges import Charges

ROOT = Path(__file__).resolve().parent.parent
console = Console()

#: order ids of this part start here, apart from the first part's
FIRST_ORDER = 100_000


@contextlib.contextmanager
def database(base: Path) -> Iterator[str | None]:
    """The demo's database URL (the charges', the outbox's): ``BEETLE_OUTBOX_DB``, or a local
    throwaway PostgreSQL, removed on the way out (None when PostgreSQL is not installed)."""
    given = os.environ.get("BEETLE_OUTBOX_DB")
    if given:
        yield given
        return
    from celery_beetle.testing.postgres import PostgresServer, postgres_bin_dir

    if postgres_bin_dir() is None:
        yield None
        return
    console.print("\nstarting a PostgreSQL on a free port for the outbox …")
    server = PostgresServer()
    try:
        server.start()
        yield server.create_database("demo")
    finally:
        server.remove()


def run(
    app, base: Path, env: dict[str, str], url: str | None, charges: Charges, orders: int = 200
) -> None:
    """Orders and their charge tasks committed together on ``url`` (PostgreSQL: the relay
    needs it), relayed by a relay killed halfway and a second one; their charges counted
    in ``charges``. Both relays are stopped, by pid, however this ends."""
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from celery_beetle import outbox
    from celery_beetle.outbox.db import engine_for
    from celery_beetle.outbox.table import OUTBOX

    if url is None:
        console.print("[yellow]no PostgreSQL installed: skipping the outbox part[/]")
        return
    engine = engine_for(url)
    demo_orders = sa.Table(
        "demo_orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True)
    )
    demo_orders.metadata.create_all(engine)
    task = app.tasks["demo.charge"]
    ids = range(FIRST_ORDER, FIRST_ORDER + orders)
    rolled_back = FIRST_ORDER + orders // 2
    for order_id in ids:
        with (
            contextlib.suppress(ZeroDivisionError),
            Session(engine) as session,
            session.begin(),
        ):
            session.execute(sa.insert(demo_orders), [{"id": order_id}])
            outbox.delay(session, task, order_id)
            if order_id == rolled_back:
                1 / 0  # noqa: B018  (an error: the transaction rolls back)
    committed = set(ids) - {rolled_back}
    console.print(f"committed {len(committed)} orders with their tasks in the outbox; "
                  f"order {rolled_back} rolled back")  # fmt: skip

    def waiting() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(OUTBOX)).scalar())

    relay_env = {**os.environ, **env, "BEETLE_OUTBOX_DB": url, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "celery_beetle.cli", "relay",
               "-A", "examples.demo_app:app", "--batch-size", "10"]  # fmt: skip
    with contextlib.ExitStack() as stack:
        stack.callback(engine.dispose)
        log = stack.enter_context(open(base / "relay.log", "ab"))

        def start_relay() -> subprocess.Popen[bytes]:
            relay = subprocess.Popen(command, env=relay_env, stdout=log, stderr=log, cwd=ROOT)
            stack.callback(_stop, relay)
            return relay

        relay = start_relay()
        deadline = time.monotonic() + 60
        while waiting() > orders // 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        relay.kill()
        relay.wait()
        console.print(f"[red]✗ killed the relay (SIGKILL) with {waiting()} rows left[/]")
        start_relay()
        console.print("[green]✓ a new relay takes over[/]")
        recorded = charges.wait_for(committed, timeout=90)
        time.sleep(1)  # copies published twice are dropped as duplicates meanwhile
        recorded = charges.recorded()
    twice = sorted(i for i in committed if recorded[i] > 1)
    never = sorted(i for i in committed if not recorded[i])
    table = Table(title="beetle outbox demo", show_header=False)
    table.add_row("orders committed with their task", str(len(committed)))
    table.add_row("their charges recorded once", str(sum(1 for i in committed if recorded[i] == 1)))
    table.add_row("recorded more than once", str(len(twice)))
    table.add_row("never recorded", str(len(never)))
    table.add_row(f"rolled-back order {rolled_back} charged", f"{recorded[rolled_back]} time(s)")
    console.print(table)
    if twice or never or recorded[rolled_back]:
        console.print(f"[bold red]recorded twice: {twice[:10]}  never recorded: {never[:10]}[/]")
        sys.exit(1)
    console.print("[bold green]every committed order charged once; the rolled-back one never[/]")


def _stop(relay: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the relay finishes its batch), then SIGKILL if it lingers."""
    if relay.poll() is not None:
        return
    relay.send_signal(signal.SIGTERM)
    try:
        relay.wait(10)
    except subprocess.TimeoutExpired:
        relay.kill()
        relay.wait()
