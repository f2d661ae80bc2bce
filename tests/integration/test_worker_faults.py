"""A Celery worker over beetle:// keeps going while brokers die, hang and come back.

The worker is a real subprocess; brokers are killed with SIGKILL or frozen with
SIGSTOP.  Task messages are published redundantly (the queue is marked so by a
transport option), so every confirmed message sits on two brokers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kombu import Connection

from celery_beetle.testing.waiting import wait_until
from tests.integration.celery_app import app as celery_app
from tests.integration.conftest import FAST

REDUNDANT = {**FAST, "redundant_queues": "celery"}
CONSUMER_RESTARTED = "Connection to broker lost"


class Publisher(threading.Thread):
    """Publishes ``it.record(i)`` for i in range(count), recording confirmed ids and latency."""

    def __init__(self, url: str, count: int, interval_s: float = 0.005, start_at: int = 0):
        super().__init__(daemon=True)
        self.url, self.count, self.interval_s, self.start_at = url, count, interval_s, start_at
        self.confirmed: list[int] = []
        self.errors: list[BaseException] = []
        self.slowest_s = 0.0

    def run(self) -> None:
        with Connection(self.url, transport_options=REDUNDANT) as conn:
            for i in range(self.start_at, self.start_at + self.count):
                started = time.monotonic()
                try:
                    celery_app.tasks["it.record"].apply_async((i,), connection=conn)
                except Exception as exc:  # recorded, the test asserts on it
                    self.errors.append(exc)
                    continue
                self.slowest_s = max(self.slowest_s, time.monotonic() - started)
                self.confirmed.append(i)
                time.sleep(self.interval_s)


@pytest.fixture
def publish(brokers) -> Iterator:
    threads: list[Publisher] = []

    def start(count: int, url: str | None = None, **kwargs) -> Publisher:
        thread = Publisher(url or brokers.beetle_url, count, **kwargs)
        thread.start()
        threads.append(thread)
        return thread

    yield start
    for thread in threads:
        thread.join(30)


def test_worker_consumes_from_every_broker(brokers, worker, publish):
    w = worker(brokers.beetle_url, options=REDUNDANT)
    pub = publish(60, interval_s=0)
    pub.join(30)
    assert w.wait_for(set(pub.confirmed)) == set()
    assert {broker for _, broker in w.runs()} == {n.host_port for n in brokers.nodes}


def test_kill_9_of_a_broker_mid_stream_loses_no_confirmed_message(brokers, worker, publish):
    w = worker(brokers.beetle_url, options=REDUNDANT)
    pub = publish(400)
    assert wait_until(lambda: len(pub.confirmed) >= 150)
    brokers.nodes[0].kill()
    pub.join(60)
    assert pub.errors == []
    # every confirmed message had a copy on a surviving broker
    assert w.wait_for(set(pub.confirmed), timeout=60) == set()
    assert w.alive()
    assert CONSUMER_RESTARTED not in w.log_text()


def test_the_worker_makes_progress_right_after_a_broker_dies(brokers, worker, publish):
    w = worker(brokers.beetle_url, options=REDUNDANT)
    publish(100, interval_s=0).join(30)
    assert wait_until(lambda: len(w.run_counts()) >= 100)
    brokers.nodes[1].kill()
    killed_at = time.monotonic()
    pub = publish(50, interval_s=0, start_at=1000)
    assert wait_until(lambda: any(i >= 1000 for i in w.run_counts()), timeout=10)
    assert time.monotonic() - killed_at < 5
    pub.join(30)
    assert w.wait_for(set(pub.confirmed)) == set()


def test_a_running_task_is_not_cancelled_when_another_broker_dies(brokers, worker):
    w = worker(brokers.beetle_url, options=REDUNDANT)
    with Connection(brokers.url_for(0), transport_options=FAST) as conn:
        celery_app.tasks["it.record"].apply_async((7, 3.0), connection=conn)
    assert wait_until(lambda: "it.record" in w.log_text() and "received" in w.log_text())
    brokers.nodes[2].kill()
    assert w.wait_for({7}, timeout=15) == set()
    assert CONSUMER_RESTARTED not in w.log_text()


def test_a_frozen_broker_hangs_neither_publisher_nor_worker(brokers, worker, publish):
    w = worker(brokers.beetle_url, options=REDUNDANT)
    pub = publish(300)
    assert wait_until(lambda: len(pub.confirmed) >= 100)
    brokers.nodes[0].pause()
    frozen_at = len(pub.confirmed)
    pub.join(60)
    assert pub.errors == []
    # bounded by the confirm timeout (1 s here) plus the publish to the next broker
    assert pub.slowest_s < FAST["confirm_timeout"] + 1.0
    assert len(pub.confirmed) == 300 and frozen_at < 300
    assert w.wait_for(set(pub.confirmed), timeout=60) == set()
    brokers.nodes[0].resume()


def test_a_broker_that_comes_back_is_consumed_again(brokers, worker):
    w = worker(brokers.beetle_url, options=REDUNDANT)
    brokers.nodes[1].kill()
    time.sleep(1)
    brokers.nodes[1].restart()
    # publish straight to the revived broker only: the worker must take it from there
    with Connection(brokers.url_for(1), transport_options=FAST) as conn:
        for i in range(20):
            celery_app.tasks["it.record"].apply_async((500 + i,), connection=conn)
    assert w.wait_for(set(range(500, 520)), timeout=30) == set()
    assert {b for i, b in w.runs() if i >= 500} == {brokers.nodes[1].host_port}
    assert CONSUMER_RESTARTED not in w.log_text()


def test_cut_traffic_to_one_broker_is_survived_and_healed(brokers, worker, tcp_proxy):
    proxy = tcp_proxy(brokers.nodes[0])
    from celery_beetle.testing.rabbit import beetle_url

    url = beetle_url([proxy.host_port, brokers.nodes[1].host_port], brokers.vhost)
    w = worker(url, options=REDUNDANT)
    with Connection(url, transport_options=REDUNDANT) as conn:
        for i in range(20):
            celery_app.tasks["it.record"].apply_async((i,), connection=conn)
        assert w.wait_for(set(range(20))) == set()
        proxy.cut()
        for i in range(20, 40):
            celery_app.tasks["it.record"].apply_async((i,), connection=conn)
        assert w.wait_for(set(range(20, 40))) == set()
        proxy.restore()
    # once healed, the worker consumes from the proxied broker again
    with Connection(beetle_url([proxy.host_port], brokers.vhost), transport_options=FAST) as c:
        assert wait_until(lambda: _try_publish(c, 99), timeout=20)
    assert w.wait_for({99}, timeout=30) == set()
    assert w.alive() and CONSUMER_RESTARTED not in w.log_text()


def _try_publish(conn: Connection, item: int) -> bool:
    try:
        celery_app.tasks["it.record"].apply_async((item,), connection=conn)
    except Exception:
        return False
    return True


def test_with_every_broker_down_the_worker_waits_and_resumes(brokers, worker):
    url = brokers.url_for(0, 1)
    # AMQP heartbeats every second: their checks must not restart the consumer meanwhile
    w = worker(url, options=REDUNDANT, extra_env={"BEETLE_TEST_HEARTBEAT": "2"})
    brokers.nodes[0].kill()
    brokers.nodes[1].kill()
    time.sleep(5)
    assert w.alive()
    brokers.nodes[0].restart()
    with Connection(brokers.url_for(0), transport_options=FAST) as conn:
        celery_app.tasks["it.record"].apply_async((1,), connection=conn)
    assert w.wait_for({1}, timeout=30) == set()
    assert CONSUMER_RESTARTED not in w.log_text()
