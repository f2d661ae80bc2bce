"""The inbox: a body's database effects committed once, though its worker is killed -9
right after the commit (before the Redis completion), many times under load.

The worker (:mod:`tests.outbox.inbox_app`, prefork) kills its pool process after the
effect's commit, once per item at a chance; the killed run's lease runs out and a later
attempt runs the body again. With the inbox it finds its row and skips; the control task
without it writes its effect a second time, which shows the scenario does hit the hole.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from kombu import Connection
from sqlalchemy.orm import Session

from celery_beetle import BeetleTask
from celery_beetle.cli import main
from celery_beetle.outbox import inbox
from celery_beetle.outbox.db import engine_for
from celery_beetle.outbox.relay import Relay
from celery_beetle.outbox.table import INBOX
from celery_beetle.settings import BeetleSettings
from celery_beetle.store import RedisStore
from celery_beetle.testing.waiting import wait_until, wait_while_progressing
from celery_beetle.testing.worker import WorkerProcess
from tests.chaos.run import FAST, TASK_OPTIONS
from tests.exactly_once.app import make_app
from tests.outbox.inbox_app import EFFECTS

#: the repository: the workers run its test apps
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(
    params=[pytest.param(200, id="ci"), pytest.param(2000, id="soak", marks=pytest.mark.soak)]
)
def messages(request: pytest.FixtureRequest) -> int:
    return int(request.param)


class InboxRun:
    def __init__(self, brokers, redis_url: str, base: Path, db_url: str) -> None:
        self.base, self.db_url, self.redis_url, self.url = (
            base,
            db_url,
            redis_url,
            brokers.beetle_url,
        )
        self.trace = base / "trace"
        self.crashes = base / "crashes"
        self.trace.mkdir(parents=True)
        self.crashes.mkdir()
        self.out = base / "worker.out"
        self.out.touch()
        self.engine = engine_for(db_url)
        EFFECTS.metadata.create_all(self.engine)
        self.app = make_app(self.url, redis_url, transport_options=dict(FAST),
                            trace_dir=str(self.trace), task_options=TASK_OPTIONS)  # fmt: skip
        self.worker: WorkerProcess | None = None

    def start_worker(
        self, chance: float, pool: str = "prefork", task_options: dict | None = None
    ) -> None:
        options = TASK_OPTIONS if task_options is None else task_options
        env = {
            "BEETLE_TEST_URL": self.url,
            "BEETLE_TEST_REDIS": self.redis_url,
            "BEETLE_TEST_OUT": str(self.out),
            "BEETLE_TEST_OPTIONS": json.dumps(FAST),
            "BEETLE_TEST_TASK": json.dumps(options),
            "BEETLE_TEST_TRACE": str(self.trace),
            "BEETLE_TEST_DB": self.db_url,
            "BEETLE_TEST_CRASH_DIR": str(self.crashes),
            "BEETLE_TEST_CRASH_CHANCE": str(chance),
        }
        self.starts = getattr(self, "starts", 0) + 1
        log = self.base / f"worker{self.starts}.log"  # a fresh log: start() waits for "ready"
        concurrency = 2 if pool == "prefork" else 1
        worker = WorkerProcess(
            "tests.outbox.inbox_app", log, env, pool=pool, concurrency=concurrency, root=ROOT
        )
        self.worker = worker.start()

    def publish(self, task_name: str, count: int) -> list[str]:
        @self.app.task(base=BeetleTask, name=task_name, shared=False)
        def stub(item: int) -> None: ...

        return [stub.delay(item).id for item in range(count)]

    def store(self) -> RedisStore:
        """The dedup store the workers use."""
        return RedisStore.from_settings(BeetleSettings.from_app(self.app))

    def stored_statuses(self, message_ids: list[str]) -> Counter[str]:
        """What the dedup store holds for each message (``completed`` once each ran)."""
        store = self.store()
        states = [store.peek("celery", message_id) for message_id in message_ids]
        return Counter(state.status.name.lower() if state else "none" for state in states)

    def events(self, *names: str) -> Counter[int]:
        return Counter(int(line.split()[1]) for line in self.out.read_text().splitlines()
                       if line.split()[0] in names)  # fmt: skip

    def effects(self) -> Counter[int]:
        with self.engine.connect() as conn:
            return Counter(row.item for row in conn.execute(sa.select(EFFECTS.c.item)))

    def kills(self) -> int:
        return len(list(self.crashes.iterdir()))

    def why_not_done(self, ids: list[str], missing: set[int]) -> str:
        """For a failure: each missing item's record in the store, its crash, and the end of
        the worker's log, so that a rare failure can be read without a rerun."""
        store = self.store()
        crashed = {path.name for path in self.crashes.iterdir()}
        lines = [
            f"  item {item}: {store.peek('celery', ids[item])!r}; crashed: {str(item) in crashed}"
            for item in sorted(missing)[:10]
        ]
        logs = sorted(self.base.glob("worker*.log"))
        tail = logs[-1].read_text(errors="replace").splitlines()[-40:] if logs else []
        return "\n".join([*lines, "worker log, last lines:", *tail])

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.engine.dispose()


@pytest.fixture
def inbox_run(brokers, redis_url, tmp_path, outbox_db):
    run = InboxRun(brokers, redis_url, tmp_path, outbox_db)
    yield run
    if run.worker is not None:
        run.worker.kill()
    run.engine.dispose()


@pytest.mark.chaos
def test_a_worker_killed_right_after_its_commit_again_and_again_leaves_each_effect_once(
    inbox_run, spark, messages
):
    from celery_beetle.audit.job import run_audit
    from kombu_beetle.trace import flush_all

    run = inbox_run
    run.start_worker(chance=0.3)
    ids = run.publish("eo.effect", messages)
    everything = set(range(messages))

    def finished() -> set[int]:
        return set(run.events("done", "skip"))

    # how long the kills take depends on the machine's load: only a run that stops
    # finishing items for longer than a killed run's lease and retry has failed (the cap
    # leaves the report its time inside the test's own timeout)
    cap = max(240, messages / 5)
    if not wait_while_progressing(
        lambda: finished() >= everything, lambda: len(finished()), timeout=cap
    ):
        missing = everything - finished()
        pytest.fail(
            f"{len(missing)} not done; {run.kills()} kills\n{run.why_not_done(ids, missing)}"
        )
    run.stop()
    flush_all()
    kills = run.kills()
    assert kills >= messages // 10, f"only {kills} kills: the crash point was not hit"
    assert run.effects() == Counter(everything), "an effect was written twice, or never"
    # every killed run was run again and found its effect committed
    assert sum(run.events("skip").values()) == kills
    assert run.stored_statuses(ids) == Counter({"completed": messages})
    summary = run_audit(spark, str(run.trace), str(run.base / "audit")).summary
    counts = {k: summary[k] for k in ("lost", "duplicated", "unexpected")}
    assert counts == dict.fromkeys(counts, 0), summary["samples"]
    assert summary["completed_once"] == messages, summary


#: BeetleTask's defaults (attempts=1, no exception retried), with a short lease so that the
#: killed runs are taken over within seconds
DEFAULT_OPTIONS_SHORT_LEASE = {"timeout": 3, "attempts": 1, "exceptions": 0}


def test_with_the_default_attempts_a_kill_right_after_the_commit_ends_as_the_inbox_says(
    inbox_run,
):
    """README: "a run after a committed one (a worker killed -9 right after the commit)
    finds it and returns, and is completed in the dedup store like any successful run" --
    with ``attempts=1`` too: the killed run noted its inbox commit in the store, so its
    crash does not dead-letter a message whose effects are committed."""
    run = inbox_run
    run.start_worker(chance=0.5, task_options=DEFAULT_OPTIONS_SHORT_LEASE)
    ids = run.publish("eo.effect", 16)
    everything = set(range(16))
    assert wait_until(lambda: set(run.events("done", "skip")) >= everything, timeout=60), (
        f"not done: {sorted(everything - set(run.events('done', 'skip')))}; "
        f"{run.kills()} kills\n{run.worker.log_text()[-3000:] if run.worker else ''}"
    )
    assert wait_until(lambda: run.stored_statuses(ids) == Counter({"completed": 16}), timeout=15), (
        run.stored_statuses(ids)
    )
    run.stop()
    kills = run.kills()
    assert kills >= 2, f"only {kills} kills: the crash point was not hit"
    assert run.effects() == Counter(everything), "an effect was written twice, or never"
    assert sum(run.events("skip").values()) == kills  # each killed run's retry found its row


@pytest.mark.chaos
def test_a_whole_worker_killed_right_after_its_commit_and_restarted_leaves_each_effect_once(
    inbox_run, spark
):
    """The solo pool runs the body in the worker's main process: the crash point kills the
    whole worker (its broker connections, its gate), and the test starts a new one."""
    from celery_beetle.audit.job import run_audit
    from kombu_beetle.trace import flush_all

    run, messages = inbox_run, 40
    run.start_worker(chance=0.15, pool="solo")
    ids = run.publish("eo.effect", messages)
    everything = set(range(messages))
    deadline = time.monotonic() + 50
    while not set(run.events("done", "skip")) >= everything:
        assert time.monotonic() < deadline, f"{run.kills()} kills; not done"
        assert run.worker is not None
        if not run.worker.alive():
            run.start_worker(chance=0.15, pool="solo")
        time.sleep(0.1)
    run.stop()
    assert run.kills() >= 2, "the worker was not killed often enough to mean anything"
    assert run.starts == run.kills() + 1
    assert run.effects() == Counter(everything), "an effect was written twice, or never"
    assert run.stored_statuses(ids) == Counter({"completed": messages})
    # the audit agrees: a worker killed -9 loses the events it had not written, but never a
    # settled message's (``completed``, or the ``duplicate`` that says the store holds it):
    # the gate writes those before the ack
    flush_all()
    summary = run_audit(spark, str(run.trace), str(run.base / "audit")).summary
    counts = {k: summary[k] for k in ("lost", "duplicated", "unexpected")}
    assert counts == dict.fromkeys(counts, 0), summary["samples"]
    assert summary["completed_once"] == messages, summary


def test_without_the_inbox_the_same_crash_writes_the_effect_twice(inbox_run):
    run = inbox_run
    run.start_worker(chance=1.0)
    run.publish("eo.effect_plain", 10)
    assert wait_until(lambda: len(run.events("done")) == 10, timeout=40)
    assert run.effects() == Counter({item: 2 for item in range(10)})


def _request(message_id: str, queue: str = "celery") -> SimpleNamespace:
    return SimpleNamespace(
        id=message_id, task="eo.effect", called_directly=False, is_eager=False,
        delivery_info={"routing_key": queue}, properties={"message_id": message_id},
    )  # fmt: skip


def test_once_is_true_for_the_first_commit_only_and_a_rollback_forgets_it(outbox_db):
    engine = engine_for(outbox_db)
    app = make_app("beetle://", "redis://127.0.0.1:1/0")
    request = _request(str(uuid.uuid4()))
    with Session(engine) as session:
        with session.begin():
            assert inbox.once(session, request, app=app)
            session.rollback()
        with session.begin():
            assert inbox.once(session, request, app=app)
            assert inbox.once(session, request, step="second", app=app)
        with session.begin():
            assert not inbox.once(session, request, app=app)
            assert not inbox.once(session, request, step="second", app=app)
        with session.begin():  # another queue, another message
            assert inbox.once(session, _request(request.id, queue="other"), app=app)
    engine.dispose()


def test_once_outside_a_worker_just_runs():
    assert inbox.once(None, SimpleNamespace(called_directly=True))


def _expired_and_live(engine, expired: int, live: int) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    rows = [
        {"scope": "q", "message_id": str(i), "step": "", "task_name": "t", "created_at": now,
         "expires_at": now + dt.timedelta(hours=-1 if i < expired else 1)}
        for i in range(expired + live)
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(sa.insert(INBOX), rows)


def _left(engine) -> set[str]:
    with engine.connect() as conn:
        return {r.message_id for r in conn.execute(sa.select(INBOX.c.message_id))}


def test_the_sweep_deletes_expired_rows_in_batches_and_keeps_the_rest(outbox_db):
    engine = engine_for(outbox_db)
    _expired_and_live(engine, 25, 5)
    assert inbox.sweep(engine, batch_size=10) == 25
    assert _left(engine) == {str(i) for i in range(25, 30)}
    engine.dispose()


def test_the_relay_loop_and_outbox_sweep_delete_expired_inbox_rows(outbox_db, brokers):
    engine = engine_for(outbox_db)
    _expired_and_live(engine, 3, 1)
    with Connection(brokers.beetle_url, transport_options=dict(FAST)) as conn:
        Relay(engine, conn.channel()).run(max_passes=1)
    assert _left(engine) == {"3"}
    _expired_and_live(engine, 2, 0)
    result = CliRunner().invoke(main, ["outbox", "sweep", "--db", outbox_db])
    assert result.exit_code == 0 and "deleted 2 expired" in result.output, result.output
    engine.dispose()
