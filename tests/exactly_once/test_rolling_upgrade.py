"""A rolling deploy of the dedup-identity change: old and new workers side by side.

A worker of the last release before this change (run from a checkout of it) and a worker of this
commit consume the same queue on the same brokers and Redis while BeetleTasks are published
with tracing on; the delivery audit counts the outcome from the traces of all of them:
nothing lost, nothing run twice, nothing unexpected. Plain names (a Celery queue, UUID ids)
keep their record key, so both versions share every record.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import ROOT, counts

#: the commit whose workers this one must run beside: the last release before the hardening
#: and dedup-identity changes (what a fleet runs when it upgrades)
PREVIOUS = "a3493029ccd99e098559806883ebd1556dd8a06e"
MESSAGES = 300


def _skip_or_fail(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} (CI=true: the rolling-upgrade test must run)", pytrace=False)
    pytest.skip(why)


@pytest.fixture
def previous_checkout(tmp_path: Path) -> Path:
    """The previous commit's tree (``git archive``: no worktree registered in the shared
    repository), or a skip saying why not."""
    git = shutil.which("git")
    if git is None:
        _skip_or_fail("git is not installed")
    assert git is not None
    found = subprocess.run(
        [git, "-C", str(ROOT), "rev-parse", "--verify", f"{PREVIOUS}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:  # a shallow clone: no server is missing, only history
        pytest.skip(f"commit {PREVIOUS} is not in this checkout's history (a shallow clone?)")
    archive = tmp_path / "previous.tar"
    subprocess.run(
        [git, "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), PREVIOUS],
        check=True,
    )
    root = tmp_path / "previous"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root


def test_old_and_new_workers_side_by_side_lose_nothing_and_run_nothing_twice(
    brokers, redis_url, client, eo_worker, previous_checkout, tmp_path, spark
):
    from celery_beetle.audit.job import run_audit
    from kombu_beetle.trace import flush_all

    assert not (previous_checkout / "celery_beetle" / "keys.py").exists(), "not the old code"
    trace = tmp_path / "trace"
    trace.mkdir()
    options = {"timeout": 5, "attempts": 5, "exceptions": 4, "retry_delay": 0.2, "max_delay": 1}
    old = eo_worker(
        pool="prefork", concurrency=2, trace_dir=str(trace), task_options=options,
        root=previous_checkout,
    )  # fmt: skip
    new = eo_worker(pool="prefork", concurrency=2, trace_dir=str(trace), task_options=options)
    app = client(trace_dir=str(trace), task_options=options)
    record = app.tasks["eo.record"]
    for item in range(MESSAGES):
        record.delay(item, 0.01)
        if item % 50 == 0:
            time.sleep(0.2)  # both workers are busy while publishing goes on
    items = set(range(MESSAGES))
    assert wait_until(lambda: set(counts([old, new])) == items, timeout=60)
    old.stop()
    new.stop()
    by_old, by_new = counts([old]), counts([new])
    assert by_old and by_new, "both versions ran tasks, or the test proves nothing"
    print(f"rolling upgrade: old worker ran {len(by_old)}, new worker {len(by_new)}")
    flush_all()
    summary = run_audit(spark, str(trace), str(tmp_path / "audit")).summary
    verdict = {k: summary[k] for k in ("messages", "completed_once", "lost", "duplicated")}
    verdict["unexpected"] = summary["unexpected"]
    assert verdict == {
        "messages": MESSAGES,
        "completed_once": MESSAGES,
        "lost": 0,
        "duplicated": 0,
        "unexpected": 0,
    }, summary
    assert counts([old, new], "start") == dict.fromkeys(items, 1)
