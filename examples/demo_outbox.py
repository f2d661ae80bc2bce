"""The demo's outbox part: orders committed with their tasks, one rolled back, the relay
killed halfway; every committed order's task runs once, the rolled-back one never.

Runs on a local throwaway PostgreSQL unless ``BEETLE_OUTBOX_DB`` names a database (its
tables ``beetle_outbox``, ``beetle_outbox_aside`` and ``demo_orders`` are created if
missing). Called by ``examples/demo.py`` while its workers run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
console = Console()

#: order ids of this part start here, apart from the first part's in runs.log
FIRST_ORDER = 100_000


@contextlib.contextmanager
def database(base: Path) -> Iterator[str | None]:
    """The outbox's database URL: ``BEETLE_OUTBOX_DB``, or a local throwaway PostgreSQL
    (None when PostgreSQL is not installed)."""
    given = os.environ.get("BEETLE_OUTBOX_DB")
    if given:
        yield given
        return
    from tests.harness.postgres import PostgresServer, postgres_bin_dir

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


def run(app, base: Path, env: dict[str, str], orders: int = 200) -> None:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from celery_beetle import outbox
    from celery_beetle.outbox.db import engine_for
    from celery_beetle.outbox.table import OUTBOX, create_tables

    with database(base) as url:
        if url is None:
            console.print("[yellow]no PostgreSQL installed: skipping the outbox part[/]")
            return
        engine = engine_for(url)
        create_tables(engine)
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
        log = open(base / "relay.log", "ab")  # noqa: SIM115
        relay = subprocess.Popen(command, env=relay_env, stdout=log, stderr=log, cwd=ROOT)
        deadline = time.monotonic() + 60
        while waiting() > orders // 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        relay.kill()
        relay.wait()
        console.print(f"[red]✗ killed the relay (SIGKILL) with {waiting()} rows left[/]")
        relay = subprocess.Popen(command, env=relay_env, stdout=log, stderr=log, cwd=ROOT)
        console.print("[green]✓ a new relay takes over[/]")
        runs = _wait_for_runs(base / "runs.log", committed, timeout=90)
        time.sleep(1)  # copies published twice are dropped as duplicates meanwhile
        runs = _wait_for_runs(base / "runs.log", committed, timeout=1)
        relay.send_signal(signal.SIGTERM)
        relay.wait(10)
        log.close()
        engine.dispose()
    twice = sorted(i for i in committed if runs[i] > 1)
    never = sorted(committed - set(runs))
    table = Table(title="beetle outbox demo", show_header=False)
    table.add_row("orders committed with their task", str(len(committed)))
    table.add_row("their tasks run once", str(sum(1 for i in committed if runs[i] == 1)))
    table.add_row("run more than once", str(len(twice)))
    table.add_row("never run", str(len(never)))
    table.add_row(f"rolled-back order {rolled_back} ran", f"{runs[rolled_back]} time(s)")
    console.print(table)
    if twice or never or runs[rolled_back]:
        console.print(f"[bold red]run twice: {twice[:10]}  never run: {never[:10]}[/]")
        sys.exit(1)
    console.print("[bold green]every committed order's task ran once; the rolled-back one never[/]")


def _wait_for_runs(path: Path, wanted: set[int], timeout: float) -> Counter[int]:
    deadline = time.monotonic() + timeout
    while True:
        runs = Counter(int(line.split()[0]) for line in path.read_text().splitlines())
        if wanted <= set(runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)
