"""A migration gets back the deliveries workers hold before it deletes a queue.

Countdown BeetleTasks (task options at their defaults, the worker at Celery's default
prefetch) sit in a worker's main process until their time comes: both copies of each are
deliveries the worker holds unacked (one in Celery's timer, its twin waiting in the gate).
``beetle queues migrate`` then moves the queue on every broker, the workers are stopped
(the blue-green step) and a new worker consumes the migrated queue: every task runs once.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from celery_beetle.cli import main
from tests.harness.celery_worker import WorkerProcess
from tests.harness.waiting import wait_until
from tests.ops.held_app import make_app

pytestmark = pytest.mark.integration

QUEUE = "celery"
TASKS = 12
#: long enough for the tasks to be held through the migration and the restart
COUNTDOWN_S = 100


def _worker(brokers, redis_url, out: Path) -> WorkerProcess:
    env = {"BEETLE_TEST_URL": brokers.beetle_url, "BEETLE_TEST_REDIS": redis_url,
           "BEETLE_TEST_OUT": str(out)}  # fmt: skip
    out.touch()
    return WorkerProcess(
        "tests.ops.held_app", out.with_suffix(".log"), env, pool="prefork", concurrency=2,
        queue=QUEUE, name="held", extra_args=("--without-heartbeat",),
    ).start()  # fmt: skip


def _held(brokers) -> tuple[int, int]:
    """(ready, unacked) of the queue over every broker, as the brokers count them now."""
    depths = [n.queue_depths(brokers.vhost).get(QUEUE, (0, 0)) for n in brokers.nodes]
    return sum(d[0] for d in depths), sum(d[1] for d in depths)


def _runs(*outs: Path) -> Counter[int]:
    return Counter(
        int(line.split()[1]) for out in outs if out.exists() for line in out.read_text().split("\n")
        if line.startswith("done ")
    )  # fmt: skip


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_countdown_tasks_held_by_workers_run_once_after_a_migration_and_a_restart(
    brokers, redis_url, tmp_path, stop
):
    blue_out = tmp_path / "blue.out"
    blue = _worker(brokers, redis_url, blue_out)
    publisher = make_app(brokers.beetle_url, redis_url)
    try:
        for item in range(TASKS):
            publisher.tasks["held.record"].apply_async((item,), countdown=COUNTDOWN_S)
        # both copies of every task held by the worker, none ready
        assert wait_until(lambda: _held(brokers) == (0, 2 * TASKS), timeout=30), _held(brokers)
        # the test brokers' API shows queue figures every second (an operator's every 5 s:
        # the default --settle-s of 5.5 s waits for one fresh figure; 2.2 s for two here)
        args = ["queues", "migrate", QUEUE, "--queue-type", "quorum", "--settle-s", "2.2",
                "--broker", brokers.beetle_url, "--redis", redis_url]  # fmt: skip
        for node in brokers.nodes:
            url = f"http://{node.host}:{node.management_port}"
            args += ["--management-url", f"{node.host_port}={url}"]
        started = time.monotonic()
        result = CliRunner().invoke(main, args)
        took = time.monotonic() - started
        assert result.exit_code == 0, result.output
        assert _runs(blue_out) == Counter(), (
            f"ran before its time (migration: {took:.0f} s)\n{result.output}"
        )
        if stop == "SIGTERM":
            blue.stop()
        else:
            blue.kill()
        green_out = tmp_path / "green.out"
        green = _worker(brokers, redis_url, green_out)
        try:
            everything = Counter(range(TASKS))
            assert wait_until(lambda: _runs(blue_out, green_out) == everything, COUNTDOWN_S + 60), (
                _runs(blue_out, green_out),
                result.output,
            )
            assert wait_until(lambda: _held(brokers) == (0, 0), timeout=30), _held(brokers)
            assert _runs(blue_out, green_out) == everything
        finally:
            green.kill()
    finally:
        blue.kill()
        publisher.close()
