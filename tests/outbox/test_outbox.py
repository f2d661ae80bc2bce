"""The outbox end to end on real PostgreSQL, brokers, Redis and workers, judged by the audit."""

from __future__ import annotations

import datetime as dt
import json

import sqlalchemy as sa

from celery_beetle.outbox.table import OUTBOX


def test_a_committed_order_runs_once_and_a_rolled_back_one_never(outbox_run, outbox_db, spark):
    run = outbox_run("commit and rollback", outbox_db)
    for item in range(20):
        run.commit_order(item, rollback=item % 5 == 0)
    assert run.waiting_rows() == 16
    run.start_worker()
    run.start_relay()
    assert run.wait_all_done() == set()
    summary = run.judge(spark)
    assert summary["messages"] == 16  # the rolled-back ones left no trace at all


def test_a_worker_relays_the_outbox_itself_with_install_relay(outbox_run, outbox_db, spark):
    run = outbox_run("relay in a worker", outbox_db)
    for item in range(10):
        run.commit_order(item)
    conf = {"BEETLE_TEST_CONF": json.dumps({"beetle_outbox_db": outbox_db})}
    worker = run.start_worker(extra_env=conf)
    assert run.wait_all_done() == set()
    assert run.waiting_rows() == 0
    assert "relaying the outbox in this worker" in worker.log_text()
    run.judge(spark)


def test_a_countdown_waits_in_the_table_until_due(outbox_run, outbox_db):
    from celery_beetle import outbox

    run = outbox_run("countdown", outbox_db)
    with sa.orm.Session(run.engine) as session, session.begin():
        result = outbox.apply_async(session, run.app.tasks["eo.record"], (1,), countdown=3600)
    with run.engine.connect() as conn:
        row = conn.execute(sa.select(OUTBOX)).mappings().one()
    assert row["id"] == result.id
    assert row["scheduled_at"] - row["created_at"] == dt.timedelta(seconds=3600)
    assert row["headers"]["eta"] is None  # no worker holds it in memory
