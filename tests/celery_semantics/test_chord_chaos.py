"""Chords of 20 BeetleTask headers with a worker killed (SIGKILL) mid-header and a broker
killed mid-chord (#26): the body runs once, with every header's result, or (a header a kill
interrupted, at the default ``attempts=1``) the chord fails once and its body never runs.

Celery counts a chord's header in the result backend as each header task finishes; a header
task that runs twice after a crash counts twice, and the body can fire early or never. Under
BeetleTask each header body runs once, so the count is right whatever the kill interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import chord

from celery_beetle.testing.worker import WorkerProcess
from tests.celery_semantics.conftest import _backend
from tests.celery_semantics.semantics_app import make_app

#: the repository: the workers run its test apps
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.chaos

HEADER = 20
EXPECTED = sum(i + i for i in range(HEADER))


class Fleet:
    def __init__(self, brokers: Any, redis_url: str, tmp_path: Path) -> None:
        self.out = tmp_path / "runs.out"
        self.out.touch()
        url = brokers.url_for(0, 1)
        backend = _backend(redis_url)
        self.env = {"BEETLE_TEST_URL": url, "BEETLE_TEST_REDIS": redis_url,
                    "BEETLE_TEST_BACKEND": backend, "BEETLE_TEST_OUT": str(self.out),
                    "BEETLE_TEST_PLAIN": "0"}  # fmt: skip
        self.tmp_path = tmp_path
        self.workers = [self.worker("a"), self.worker("b")]
        self.app = make_app(url, redis_url, backend)

    def worker(self, name: str) -> WorkerProcess:
        return WorkerProcess(
            "tests.celery_semantics.semantics_app", self.tmp_path / f"worker-{name}.log",
            self.env, pool="prefork", concurrency=2, name=f"chord-{name}", root=ROOT,
        ).start()  # fmt: skip

    def runs(self) -> list[tuple[str, list[str], int]]:
        rows = []
        for line in self.out.read_text().splitlines():
            name, *args, pid = line.split()
            rows.append((name, args, int(pid)))
        return rows

    def kill_mid_header(self, task: str, victim: WorkerProcess, timeout: float = 30) -> None:
        """SIGKILL ``victim`` once one of its pool processes is running a header body."""
        from celery_beetle.testing.worker import _children

        pool = set(_children(victim.pid or 0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            started = [pid for name, _, pid in self.runs() if name == task]
            if pool & set(started):
                victim.kill()
                return
            time.sleep(0.05)
        pytest.fail(f"no {task} body began in the victim within {timeout} s")

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.app.close()


@pytest.fixture
def fleet(brokers: Any, redis_url: str, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(brokers, redis_url, tmp_path)
    try:
        yield fleet
    finally:
        fleet.close()


def test_a_chord_whose_header_survives_a_worker_and_a_broker_kill_runs_its_body_once(
    fleet, brokers
):
    slow_thrice, tsum = fleet.app.tasks["sem.slow_thrice"], fleet.app.tasks["sem.tsum"]
    result = chord(slow_thrice.s(i, i) for i in range(HEADER))(tsum.s())

    fleet.kill_mid_header("slow_thrice", fleet.workers[0])
    fleet.workers.append(fleet.worker("c"))  # the killed one's replacement, as a deploy does
    brokers.nodes[0].kill()  # mid-chord: the header's rest and the body on one broker

    assert result.get(timeout=90) == EXPECTED
    runs = fleet.runs()
    assert [args for name, args, _ in runs if name == "tsum"] == [[str(HEADER)]]
    completed = {tuple(args) for name, args, _ in runs if name == "slow_thrice"}
    assert completed == {(str(i), str(i)) for i in range(HEADER)}
    time.sleep(3)  # a late second body (a redelivered copy, a twin) would show up here
    assert sum(1 for name, _, _ in fleet.runs() if name == "tsum") == 1
    result.parent.join(timeout=30)  # the header's results, read while the backend is up


def test_at_the_defaults_a_chord_whose_header_a_kill_interrupted_fails_once_and_never_runs(
    fleet,
):
    """``attempts=1``: the interrupted header is dead-lettered (a FAILURE in the backend), so
    the chord fails, as Celery's chord does when a header task fails: its body never runs, the
    caller's ``get()`` ends with the error instead of waiting forever."""
    slow, tsum = fleet.app.tasks["sem.slow"], fleet.app.tasks["sem.tsum"]
    result = chord(slow.s(i, i) for i in range(HEADER))(tsum.s())

    fleet.kill_mid_header("slow", fleet.workers[0])

    with pytest.raises(Exception, match=r"AttemptsExhausted|started 1 time"):
        result.get(timeout=90)
    time.sleep(3)
    assert not [row for row in fleet.runs() if row[0] == "tsum"]
    headers = [args for name, args, _ in fleet.runs() if name == "slow"]
    assert len({tuple(a) for a in headers}) == HEADER  # each began; none twice but the killed
    assert len(headers) == HEADER
    result.parent.join(timeout=30, propagate=False)  # read while the backend is up
