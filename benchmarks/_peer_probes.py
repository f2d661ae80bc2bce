"""Two probes of ``bench_peers`` beside its rates: countdowns against due tasks, and the
Redis round trips a BeetleTask makes before its body.

**Countdown probe**: one worker (prefork ``-c 2``, default prefetch) gets 12 tasks with a
15 s countdown, then 20 tasks due now. Celery holds a countdown task in the worker until it
is due, and it counts against the prefetch; with a global QoS (classic queues) Celery raises
the prefetch for each held task, with a per-consumer QoS (quorum queues) it cannot, so the
due tasks may wait behind the countdowns. Counted: the due tasks that ran before the
countdowns came due, and those that ran within 0.5 s of being sent.

**Round trips before the body**: Redis ``MONITOR`` (run by ``redis-cli``) records every
command with its time; the commands a client sent (not those a script ran) that name a
task's id, and came before its body ran, are the synchronous trips between its publish and
its body (the publisher's included)."""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from celery import Celery

from benchmarks.bench_latency import _runs, _wait_for, workers

COUNTDOWNS, DUE, COUNTDOWN_S = 12, 20, 15.0


def client_app(url: str, redis_url: str, queue_type: str) -> Celery:
    """A publishing app: confirmed publishes (pyamqp's ``confirm_publish``; ``beetle://``
    always confirms), queues of ``queue_type``."""
    client = Celery("bench_peers_client", broker=url, set_as_current=False)
    client.conf.beetle_redis_url = redis_url
    client.conf.broker_transport_options = {"confirm_publish": True}
    client.conf.task_default_queue_type = queue_type
    client.conf.task_create_missing_queue_type = queue_type
    return client


def bench_task(client: Celery, task_name: str) -> Any:
    from celery_beetle import BeetleTask

    def body(i: float) -> None: ...

    base = BeetleTask if task_name == "bench.beetle" else None
    return client.task(name=task_name, base=base, shared=False)(body)


def countdown_probe(
    url: str, redis_url: str, task_name: str, queue_type: str, tmp: Path
) -> tuple[int, int, float]:
    """(due tasks run before the countdowns came due, within 0.5 s, the last one's wait s)."""
    queue = f"probe-{task_name.split('.')[1]}-{queue_type}-{time.monotonic_ns()}"
    out = tmp / f"{queue}.out"
    client = client_app(url, redis_url, queue_type)
    task = bench_task(client, task_name)
    env = {"BENCH_QUEUE_TYPE": queue_type}
    with workers(url, redis_url, queue, out, env=env) as procs:
        with client.producer_or_acquire() as producer:
            task.apply_async((-2.0,), queue=queue, producer=producer)  # declares; warms up
            _wait_for(out, 1, 60, procs)
            due_at = time.time() + COUNTDOWN_S  # when the first countdown comes due
            for _ in range(COUNTDOWNS):
                task.apply_async((-1.0,), queue=queue, producer=producer, countdown=COUNTDOWN_S)
            for _ in range(DUE):
                task.apply_async((time.time(),), queue=queue, producer=producer)
        deadline = time.monotonic() + COUNTDOWN_S + 10
        while time.monotonic() < deadline:
            if sum(1 for _, sent in _runs(out) if sent > 0) >= DUE:
                break
            time.sleep(0.1)
    client.close()
    due = [(ran, sent) for ran, sent in _runs(out) if sent > 0]
    before = sum(1 for ran, _ in due if ran < due_at)
    quick = sum(1 for ran, sent in due if ran - sent <= 0.5)
    last = max((ran - sent for ran, sent in due), default=float("nan"))
    return before, quick, last


def paced(
    url: str, redis_url: str, task_name: str, queue: str, tasks: int, rate: float, out: Path
) -> list[str]:
    """Run a worker and publish ``tasks`` tasks (argument: their index) at ``rate`` per
    second; return their ids once all ran."""
    client = client_app(url, redis_url, "classic")
    task = bench_task(client, task_name)
    ids = []
    with workers(url, redis_url, queue, out) as procs:
        with client.producer_or_acquire() as producer:
            task.apply_async((-1.0,), queue=queue, producer=producer)  # declares; warms up
            _wait_for(out, 1, 60, procs)
            start = time.monotonic()
            for i in range(tasks):
                time.sleep(max(0.0, start + i / rate - time.monotonic()))
                ids.append(task.apply_async((i,), queue=queue, producer=producer).id)
        _wait_for(out, tasks + 1, 60, procs)
        time.sleep(0.5)  # the last completions are stored
    client.close()
    return ids


class RedisMonitor:
    """``redis-cli MONITOR`` into a file while a run lasts (it costs Redis CPU: never run it
    in a timed run)."""

    def __init__(self, port: int, out: Path) -> None:
        self.out = out
        self._file = out.open("wb")
        args = ["redis-cli", "-p", str(port), "monitor"]
        self._proc = subprocess.Popen(args, stdout=self._file, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self._proc.send_signal(signal.SIGTERM)
        self._proc.wait(10)
        self._file.close()


_ENTRY = re.compile(r"^(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$")


def trips_before_body(monitor: Path, ids: list[str], runs: Path) -> dict[str, float]:
    """Per task (``ids[i]`` ran with argument ``i``): client commands naming its id before
    its body ran (``runs``: a worker's ``out`` file) and after; mean and max of each."""
    ran = {ids[int(arg)]: when for when, arg in _runs(runs) if 0 <= arg < len(ids)}
    before = dict.fromkeys(ran, 0)
    after = dict.fromkeys(ran, 0)
    for line in monitor.read_text(errors="replace").splitlines():
        match = _ENTRY.match(line)
        if match is None or match.group(2) == "lua":
            continue
        when, command = float(match.group(1)), match.group(3)
        for task_id in set(re.findall(r"[0-9a-f]{8}-[0-9a-f-]{27}", command)):
            if task_id in ran:
                (before if when < ran[task_id] else after)[task_id] += 1
    if not ran:
        return {"tasks": 0}
    return {
        "tasks": len(ran),
        "before_mean": statistics.fmean(before.values()),
        "before_max": max(before.values()),
        "after_mean": statistics.fmean(after.values()),
        "after_max": max(after.values()),
    }
