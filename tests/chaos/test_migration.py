"""Live queue migration under load, judged by the audit: a busy classic queue becomes a
quorum queue on every broker while a publisher publishes and old (classic config) and new
(quorum config) workers consume; the migration killed -9 halfway and resumed; retries
pending and dead letters present when it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from celery_beetle.testing.waiting import wait_until
from tests.chaos.conftest import RESULTS, judge

QUEUE = "celery"
#: what a "new" worker's config says once the deploy switched it to quorum
NEW_WORKER = {"task_default_queue_type": "quorum"}


def migrate(brokers, redis_url, *extra: str, log: Path) -> subprocess.Popen:
    """``beetle queues migrate`` in a process of its own (so that it can be killed -9)."""
    args = [
        sys.executable, "-c", "from celery_beetle.cli import main; main()",
        "queues", "migrate", "-Q", QUEUE, "--broker", brokers.beetle_url, "--redis", redis_url,
        "--settle-s", "1", *extra,
    ]  # fmt: skip
    for node in brokers.nodes:
        args += ["--management-url", f"{node.host_port}=http://{node.host}:{node.management_port}"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)


def queue_types(brokers) -> list[str]:
    types = []
    for node in brokers.nodes:
        info = node._api("GET", f"/api/queues/{brokers.vhost}/{QUEUE}") or {}
        types.append(info.get("type", "missing"))
    return types


def _pace(messages: int) -> float:
    """Publish over ~12 s (CI) so that the whole migration happens under load."""
    return 0.05 if messages < 1000 else 0.02


def test_classic_to_quorum_migration_of_a_busy_queue_with_old_and_new_workers(
    chaos, brokers, redis_url, spark, messages, tmp_path
):
    run = chaos("migrate classic->quorum, blue-green")
    run.start_worker()  # blue: the old config (a classic queue)
    run.start_publisher(messages, interval_s=_pace(messages))
    run.wait_published(messages // 6)
    run.start_worker(conf=NEW_WORKER)  # green: the new config, before the migration
    run.fault()
    log = tmp_path / "migrate.log"
    proc = migrate(brokers, redis_url, "--queue-type", "quorum", log=log)
    assert proc.wait(timeout=120) == 0, log.read_text()
    assert queue_types(brokers) == ["quorum"] * 3, log.read_text()
    run.start_worker(conf=NEW_WORKER)  # a green worker started after the migration
    assert run.wait_all_done() == set()
    judge(run, spark)


def test_migration_killed_9_halfway_then_resumed(
    chaos, brokers, redis_url, spark, messages, tmp_path
):
    run = chaos("migrate, kill -9 halfway, resume")
    run.start_worker()
    run.start_worker(conf=NEW_WORKER)
    run.start_publisher(messages, interval_s=_pace(messages))
    run.wait_published(messages // 6)
    run.fault()
    log = tmp_path / "migrate.log"
    proc = migrate(brokers, redis_url, "--queue-type", "quorum", log=log)
    # halfway: the first broker is done, the next one under way
    wait_until(lambda: "recreated" in log.read_text() or proc.poll() is not None, timeout=60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    status = migrate(brokers, redis_url, "--status", log=log)
    assert status.wait(timeout=30) == 3, log.read_text()  # 3: under way
    time.sleep(1)
    resumed = migrate(brokers, redis_url, "--resume", log=log)
    assert resumed.wait(timeout=120) == 0, log.read_text()
    assert queue_types(brokers) == ["quorum"] * 3, log.read_text()
    assert run.wait_all_done() == set()
    judge(run, spark)


@pytest.mark.soak
def test_soak_migration_back_and_forth_under_load(
    chaos, brokers, redis_url, spark, messages, tmp_path
):
    run = chaos("soak classic-quorum-classic-quorum")
    run.start_worker()
    run.start_worker(conf=NEW_WORKER)
    run.start_publisher(messages, interval_s=0.01)
    run.wait_published(messages // 6)
    run.fault()
    log = tmp_path / "migrate.log"
    for queue_type in ("quorum", "classic", "quorum"):
        proc = migrate(brokers, redis_url, "--queue-type", queue_type, log=log)
        assert proc.wait(timeout=300) == 0, log.read_text()
    assert run.wait_all_done(timeout=300) == set()
    judge(run, spark)


def _dead_copies(brokers) -> int:
    return sum(depths.get(f"{QUEUE}.dead", (0, 0))[0] for depths in brokers.queue_depths())


def test_retries_pending_and_dead_letters_present_when_the_migration_starts(
    chaos, brokers, redis_url, spark, messages, tmp_path
):
    """Dead letters (``eo.fixable``, broken) sit in ``celery.dead`` and retries
    (``eo.flaky``, 2 s, 4 s, 4 s apart) in ``celery.delay.*`` when the migration starts: the
    retries come back to the migrated queue by name and end as dead letters, and a replay
    afterwards lands in the migrated queue and runs each fixed message once."""
    run = chaos(
        "migrate with retries and dead letters",
        task_options={"retry_delay": 2, "max_delay": 4, "exceptions": 3, "attempts": 6},
    )
    broken = tmp_path / "broken"
    broken.touch()
    for _ in range(2):
        run.start_worker(extra_env={"BEETLE_TEST_BROKEN": str(broken)})
    publisher = run.start_publisher(messages, interval_s=_pace(messages))
    count = 10
    app = publisher.app
    fixable = [app.tasks["eo.fixable"].delay(10_000 + i).id for i in range(count)]
    assert wait_until(lambda: _dead_copies(brokers) == 2 * count, timeout=30)
    flaky = [app.tasks["eo.flaky"].delay(20_000 + i).id for i in range(count)]
    run.fault()
    log = tmp_path / "migrate.log"
    proc = migrate(brokers, redis_url, "--queue-type", "quorum", log=log)
    assert proc.wait(timeout=120) == 0, log.read_text()
    assert queue_types(brokers) == ["quorum"] * 3
    # every flaky message gave up after its retries: a dead letter on two brokers each
    assert wait_until(lambda: _dead_copies(brokers) == 4 * count, timeout=60), _dead_copies(brokers)
    broken.unlink()
    replay = subprocess.run(
        [sys.executable, "-c", "from celery_beetle.cli import main; main()",
         "dead", "replay", "-Q", QUEUE, "--task", "eo.fixable", "--broker", brokers.beetle_url,
         "--redis", redis_url, "--trace-dir", str(run.trace_dir)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert wait_until(lambda: _dead_copies(brokers) == 2 * count, timeout=30)
    assert run.wait_all_done() == set()
    assert wait_until(
        lambda: {i for i, _ in run.done_lines()} >= {10_000 + i for i in range(count)}, 30
    )
    run.stop()
    result = run.audit(spark)
    RESULTS.append(result)
    s = result.summary
    assert (s["lost"], s["duplicated"], s["unexpected"]) == (0, 0, 0), s["samples"]
    assert s["replayed"] == count, s
    assert s["dead_lettered"] == count, s
    assert s["completed_once"] == len(run.publisher.confirmed), s
    assert len(fixable) == len(flaky) == count
