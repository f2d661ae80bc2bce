"""A migration gets back the deliveries workers hold before it deletes a queue.

Countdown BeetleTasks (task options at their defaults, the worker at Celery's default
prefetch) sit in a worker's main process until their time comes: both copies of each are
deliveries the worker holds unacked (one in Celery's timer, its twin waiting in the gate).
``beetle queues migrate`` then moves the queue on every broker, the workers are stopped
(the blue-green step) and a new worker consumes the migrated queue: every task runs once.

The old worker is stopped both ways an operator stops one: SIGTERM (a warm shutdown hands
the held deliveries back) and SIGKILL (the brokers take them back when its connections
drop). The two run side by side in one test, each on a vhost of its own, so that they
wait out one countdown rather than two.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from celery import Celery

from celery_beetle.testing.rabbit import BrokerSet
from celery_beetle.testing.servers import fresh_vhost
from celery_beetle.testing.waiting import wait_until
from celery_beetle.testing.worker import WorkerProcess
from tests.ops.held_app import make_app

#: the repository: the workers run its test apps
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

QUEUE = "celery"
TASKS = 12
#: long enough for the tasks to be held through the migration and the restart
COUNTDOWN_S = 100
#: how the old (blue) worker is stopped in each half of the test
STOPS = ("SIGTERM", "SIGKILL")


def _worker(brokers, redis_url, out: Path) -> WorkerProcess:
    env = {"BEETLE_TEST_URL": brokers.beetle_url, "BEETLE_TEST_REDIS": redis_url,
           "BEETLE_TEST_OUT": str(out)}  # fmt: skip
    out.touch()
    return WorkerProcess(
        "tests.ops.held_app", out.with_suffix(".log"), env, pool="prefork", concurrency=2,
        queue=QUEUE, name="held", extra_args=("--without-heartbeat",), root=ROOT,
    ).start()  # fmt: skip


def _held(brokers) -> tuple[int, int]:
    """(ready, unacked) of the queue over every broker, as the brokers count them now."""
    depths = [node.get(QUEUE, (0, 0)) for node in brokers.queue_depths()]
    return sum(d[0] for d in depths), sum(d[1] for d in depths)


def _runs(*outs: Path) -> Counter[int]:
    return Counter(
        int(line.split()[1]) for out in outs if out.exists() for line in out.read_text().split("\n")
        if line.startswith("done ")
    )  # fmt: skip


def _migrate(brokers, redis_url, log: Path) -> subprocess.Popen:
    """``beetle queues migrate`` of the queue to quorum, in a process of its own (the two
    halves' migrations run at once), its output in ``log``."""
    # the test brokers' API shows queue figures every second (an operator's every 5 s:
    # the default --settle-s of 5.5 s waits for one fresh figure; 2.2 s for two here)
    args = [sys.executable, "-c", "from celery_beetle.cli import main; main()",
            "queues", "migrate", "-Q", QUEUE, "--queue-type", "quorum", "--settle-s", "2.2",
            "--broker", brokers.beetle_url, "--redis", redis_url]  # fmt: skip
    for node in brokers.nodes:
        url = f"http://{node.host}:{node.management_port}"
        args += ["--management-url", f"{node.host_port}={url}"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)


@dataclass
class _Fleet:
    """One half of the test: a vhost, its blue (old) and green (new) workers, what they ran."""

    stop: str
    brokers: BrokerSet
    base: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    migration: str = ""

    @property
    def outs(self) -> tuple[Path, Path]:
        return self.base / "blue.out", self.base / "green.out"

    def start(self, colour_out: Path, redis_url: str) -> WorkerProcess:
        worker = _worker(self.brokers, redis_url, colour_out)
        self.workers.append(worker)
        return worker

    def runs(self) -> Counter[int]:
        return _runs(*self.outs)

    def held(self) -> tuple[int, int]:
        return _held(self.brokers)


@pytest.fixture
def fleets(brokers, rabbit_nodes, tmp_path) -> Iterator[list[_Fleet]]:
    """One fleet per way of stopping the blue worker: the test's vhost and one more."""
    with ExitStack() as stack:
        result = []
        for index, stop in enumerate(STOPS):
            vhost = brokers.vhost if index == 0 else stack.enter_context(fresh_vhost(rabbit_nodes))
            base = tmp_path / stop
            base.mkdir()
            result.append(_Fleet(stop, BrokerSet(nodes=brokers.nodes, vhost=vhost), base))
        try:
            yield result
        finally:
            for fleet in result:
                for worker in fleet.workers:
                    worker.kill()


def test_countdown_tasks_held_by_workers_run_once_after_a_migration_and_a_restart(
    fleets, redis_url
):
    blues = [fleet.start(fleet.outs[0], redis_url) for fleet in fleets]
    publishers: list[Celery] = []
    migrations: list[subprocess.Popen] = []
    try:
        for fleet in fleets:
            publisher = make_app(fleet.brokers.beetle_url, redis_url)
            publishers.append(publisher)
            for item in range(TASKS):
                publisher.tasks["held.record"].apply_async((item,), countdown=COUNTDOWN_S)
        # both copies of every task held by the worker, none ready
        for fleet in fleets:
            assert wait_until(lambda f=fleet: f.held() == (0, 2 * TASKS), timeout=30), (
                fleet.stop,
                fleet.held(),
            )
        started = time.monotonic()
        migrations += [_migrate(f.brokers, redis_url, f.base / "migrate.log") for f in fleets]
        for fleet, migration in zip(fleets, migrations, strict=True):
            exit_code = migration.wait(timeout=180)
            took = time.monotonic() - started
            fleet.migration = (fleet.base / "migrate.log").read_text()
            assert exit_code == 0, (fleet.stop, fleet.migration)
            assert fleet.runs() == Counter(), (
                f"{fleet.stop}: ran before its time (migration: {took:.0f} s)\n{fleet.migration}"
            )
        for fleet, blue in zip(fleets, blues, strict=True):
            if fleet.stop == "SIGTERM":
                blue.stop()
            else:
                blue.kill()
        for fleet in fleets:
            fleet.start(fleet.outs[1], redis_url)
        everything = Counter(range(TASKS))
        for fleet in fleets:
            assert wait_until(lambda f=fleet: f.runs() == everything, COUNTDOWN_S + 60), (
                fleet.stop,
                fleet.runs(),
                fleet.migration,
            )
            assert wait_until(lambda f=fleet: f.held() == (0, 0), timeout=30), (
                fleet.stop,
                fleet.held(),
            )
            assert fleet.runs() == everything, fleet.stop
    finally:
        for migration in migrations:
            if migration.poll() is None:
                migration.kill()
                migration.wait()
        for publisher in publishers:
            publisher.close()
