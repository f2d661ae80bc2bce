"""Faults while the outbox relays, each judged by the audit: every committed order's task
runs once, none is lost, duplicated, unexpected or never relayed.

Each scenario has a CI version (a few hundred orders, under a minute) and a ``soak`` one.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
import sqlalchemy as sa

from celery_beetle.outbox.table import ASIDE, OUTBOX
from celery_beetle.testing.waiting import wait_until
from tests.outbox.conftest import new_outbox_db

pytestmark = pytest.mark.chaos


@pytest.fixture(
    params=[pytest.param(200, id="ci"), pytest.param(3000, id="soak", marks=pytest.mark.soak)]
)
def orders(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def _keep_relaying(run, orders_thread, *, crash_chance: float, timeout: float = 120) -> int:
    """Restart the relay whenever it dies until every committed row is gone; the kills."""
    kills = 0
    relay = run.start_relay(crash_chance=crash_chance, batch_size=10)
    deadline = time.monotonic() + timeout
    while orders_thread.is_alive() or run.waiting_rows():
        assert time.monotonic() < deadline, f"rows left: {run.waiting_rows()}"
        if relay.poll() is not None:
            assert relay.returncode == -signal.SIGKILL, run.relay_logs()[-3000:]
            kills += 1
            relay = run.start_relay(crash_chance=crash_chance, batch_size=10)
        time.sleep(0.05)
    return kills


def test_relay_killed_between_publish_and_delete_again_and_again(
    outbox_run, outbox_db, spark, orders
):
    run = outbox_run("relay kill -9 after publish", outbox_db)
    run.start_worker()
    thread = run.commit_orders(range(orders), interval_s=0.002, background=True)
    # half the passes die after publishing (about 20 passes of 10 rows each for 200 orders)
    kills = _keep_relaying(run, thread, crash_chance=0.5)
    assert kills >= 3, "the relay was not killed often enough to mean anything"
    assert run.wait_all_done() == set()
    run.judge(spark)


def test_two_relays_side_by_side(outbox_run, outbox_db, spark, orders):
    run = outbox_run("two relays", outbox_db)
    run.start_worker()
    run.start_relay(batch_size=10)
    run.start_relay(batch_size=10)
    run.wait_relays_ready()
    run.commit_orders(range(orders), interval_s=0.002)
    assert wait_until(lambda: run.waiting_rows() == 0, timeout=60)
    assert run.wait_all_done() == set()
    run.judge(spark)
    counts = [json.loads(line) for line in run.relay_logs().splitlines() if line.startswith("{")]
    assert len(counts) == 2 and all(c["relayed"] > 0 for c in counts), counts
    assert sum(c["relayed"] for c in counts) == orders


def test_postgres_killed_and_restarted_mid_relay(outbox_run, postgres_own, spark, orders):
    run = outbox_run("postgres kill -9 mid-relay", new_outbox_db(postgres_own))
    run.start_worker()
    run.start_relay(batch_size=20)
    thread = run.commit_orders(range(orders), interval_s=0.002, background=True)
    assert wait_until(lambda: len(run.done_items()) >= orders // 4, timeout=60)
    postgres_own.kill()
    time.sleep(1)
    postgres_own.start()
    thread.join(120)
    assert wait_until(lambda: run.waiting_rows() == 0, timeout=60)
    assert run.wait_all_done() == set()
    run.judge(spark)


def test_a_broker_killed_mid_relay(outbox_run, outbox_db, brokers, spark, orders):
    run = outbox_run("broker kill -9 mid-relay", outbox_db)
    run.start_worker()
    run.start_relay(batch_size=20)
    thread = run.commit_orders(range(orders), interval_s=0.002, background=True)
    assert wait_until(lambda: len(run.done_items()) >= orders // 4, timeout=60)
    brokers.nodes[0].kill()
    thread.join(120)
    assert wait_until(lambda: run.waiting_rows() == 0, timeout=60)
    brokers.nodes[0].restart()
    assert run.wait_all_done() == set()
    run.judge(spark)


def test_the_table_restored_from_a_snapshot_is_relayed_again_without_a_second_run(
    outbox_run, outbox_db, spark, orders
):
    run = outbox_run("restore from a snapshot", outbox_db)
    run.start_worker()
    run.commit_orders(range(orders))
    with run.engine.connect() as conn:
        snapshot = [dict(row) for row in conn.execute(sa.select(OUTBOX)).mappings()]
    relay = run.start_relay(batch_size=50)
    assert wait_until(lambda: run.waiting_rows() == 0, timeout=60)
    assert run.wait_all_done() == set()
    relay.terminate()
    relay.wait(10)
    # the second copy of each reached a worker, which dropped it
    assert wait_until(lambda: _events(run, "duplicate") >= orders, timeout=60)
    before = _events(run, "duplicate")
    # the backup is restored: every row is back, one of them from before the dedup window
    old = snapshot[0]
    old["expires_at"] = old["created_at"]
    with run.engine.begin() as conn:
        conn.execute(sa.insert(OUTBOX), snapshot)
    run.start_relay(batch_size=50)
    assert wait_until(lambda: run.waiting_rows() == 0, timeout=60)
    # both copies of each row published again reach a worker, which drops them
    again = 2 * (orders - 1)
    assert wait_until(lambda: _events(run, "duplicate") >= before + again, timeout=60)
    run.judge(spark)
    with run.engine.connect() as conn:
        aside = conn.execute(sa.select(ASIDE.c.id, ASIDE.c.reason)).all()
    assert [a.id for a in aside] == [old["id"]]
    assert "dedup window" in aside[0].reason


def _events(run, name: str) -> int:
    """How many ``name`` events the trace holds so far (workers flush every second)."""
    count = 0
    for path in run.trace_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                count += json.loads(line)["event"] == name
            except (ValueError, KeyError):
                continue
    return count
