"""What a worker's log says about an expected condition: one line as it starts, one as it ends.

A broker lost and back, a dedup store unreachable at start or during work: an operator reads
each as a pair of lines with counts, at WARNING, and no traceback.
"""

from __future__ import annotations

import json
import re
import time

from celery_beetle.testing.rabbit import beetle_url
from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts


def _lines(log: str, pattern: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(pattern, line)]


def test_a_broker_lost_and_back_is_said_once_each_way_whatever_connections_notice(
    brokers, client, eo_worker, tcp_proxy
):
    proxy = tcp_proxy(brokers.nodes[0])
    url = beetle_url([proxy.host_port, brokers.nodes[1].host_port], brokers.vhost)
    worker = eo_worker(url=url)
    app = client(url=url)
    app.tasks["eo.record"].delay(0)
    assert wait_until(lambda: counts([worker])[0] == 1, timeout=20)
    proxy.cut()
    # the producer's connection notices too: a retry is published while the broker is away
    app.tasks["eo.flaky"].delay(1)
    assert wait_until(lambda: counts([worker], "start")[1] >= 1, timeout=20)
    time.sleep(2)  # both connections have had their chance to notice
    proxy.restore()
    app.tasks["eo.flaky"].delay(2)
    assert wait_until(lambda: counts([worker], "start")[2] >= 2, timeout=30), worker.log_text()
    name = re.escape(proxy.host_port)
    assert wait_until(lambda: _lines(worker.log_text(), f"broker {name} is up again"), 20)
    log = worker.log_text()
    assert len(_lines(log, f"broker {name} is down")) == 1, log[-4000:]
    assert len(_lines(log, f"broker {name} is up again")) == 1, log[-4000:]


def _around(log: str, what: str) -> str:
    at = log.find(what)
    return log[max(0, at - 1500) : at + 3000] if at >= 0 else log[-3000:]


def _store_lines(log: str) -> tuple[list[str], list[str]]:
    """The outage's start lines and end lines."""
    return _lines(log, r"dedup store \S+ is unreachable"), _lines(
        log, r"dedup store \S+ answers again"
    )


def _unacked(brokers, queue: str = "celery") -> int:
    return sum(depths.get(queue, (0, 0))[1] for depths in brokers.queue_depths())


def test_a_worker_whose_dedup_store_is_down_says_so_at_start_and_once_more_when_it_answers(
    brokers, client, eo_worker, redis_own
):
    redis_own.kill()
    worker = eo_worker(redis=redis_own.url)
    began, ended = _store_lines(worker.log_text())
    assert len(began) == 1 and not ended, worker.log_text()[-3000:]
    assert redis_own.url in began[0]  # it names the store
    assert "WARNING" in began[0] and "parking deliveries" in began[0]
    client().tasks["eo.record"].delay(1)
    assert wait_until(lambda: _unacked(brokers) == 2, timeout=10)  # both copies parked
    assert counts([worker], "start") == {}
    redis_own.start()
    assert wait_until(lambda: counts([worker])[1] == 1, timeout=30), worker.log_text()[-3000:]
    log = worker.log_text()
    began, ended = _store_lines(log)
    assert (len(began), len(ended)) == (1, 1), log[-3000:]
    assert re.search(r"answers again after \d+\.\d s: 2 deliveries parked, 0 handed back", ended[0])
    assert "Traceback" not in log, log[-3000:]


def test_redis_down_during_work_is_one_warning_as_it_begins_and_one_with_counts_as_it_ends(
    brokers, client, eo_worker, redis_aof
):
    worker = eo_worker(redis=redis_aof.url, pool="prefork", concurrency=2)
    app = client()
    items = list(range(30))
    for item in items:
        app.tasks["eo.record"].delay(item, 0.1)
    assert wait_until(lambda: len(counts([worker])) >= 5, timeout=20)
    redis_aof.kill()
    assert wait_until(lambda: _store_lines(worker.log_text())[0], timeout=10)
    time.sleep(5)  # the outage's duration: what waits for a pool process is parked
    redis_aof.start()
    assert wait_until(lambda: set(counts([worker])) == set(items), timeout=40)
    assert counts([worker], "start") == dict.fromkeys(items, 1)
    log = worker.log_text()
    began, ended = _store_lines(log)
    assert (len(began), len(ended)) == (1, 1), log[-4000:]
    # under prefork a delivery waits in the gate for a free process, so the outage parks it
    # there; a copy the pool could not start would be handed back, counted beside it
    assert re.search(r"[1-9]\d* deliveries parked, \d+ handed back", ended[0]), ended[0]
    assert "Traceback" not in log and "reject requeue=True" not in log, log[-4000:]


def test_with_wait_replicas_the_gate_resumes_only_once_a_write_gets_a_replica_s_ack(
    client, eo_worker, redis_sentinel
):
    """A master without a replica to acknowledge (a failover's new master, here the replica
    stopped) takes a plain write but none of the store's: the gate stays paused until one
    acknowledges, rather than resuming after a second only to pause again."""
    conf = {"BEETLE_TEST_CONF": json.dumps({"beetle_redis_wait_replicas": 1})}
    worker = eo_worker(redis=redis_sentinel.url, pool="prefork", concurrency=2, extra_env=conf)
    app = client()
    app.tasks["eo.record"].delay(0)
    assert wait_until(lambda: counts([worker])[0] == 1, timeout=20)
    items = list(range(1, 7))
    replica = redis_sentinel.nodes[1]
    replica.pause()
    try:
        for item in items:
            app.tasks["eo.record"].delay(item)
        assert wait_until(lambda: _store_lines(worker.log_text())[0], timeout=20)
        time.sleep(4)  # the replica's silence: a probe that does not wait resumes within 1 s
        began, ended = _store_lines(worker.log_text())
        assert (len(began), len(ended)) == (1, 0), worker.log_text()[-4000:]
    finally:
        replica.resume()
    assert wait_until(lambda: set(counts([worker])) == {0, *items}, timeout=40)
    assert counts([worker], "start") == dict.fromkeys([0, *items], 1)
    log = worker.log_text()
    began, ended = _store_lines(log)
    assert (len(began), len(ended)) == (1, 1), log[-4000:]
    assert "Traceback" not in log, log[-4000:]


def test_after_a_sentinel_failover_the_gate_resumes_once_the_new_master_has_a_replica(
    client, eo_worker, redis_sentinel
):
    """The new master takes plain writes at once but none of the store's, which wait for a
    replica: the gate pauses once and resumes once, when the old master rejoins."""
    conf = {"BEETLE_TEST_CONF": json.dumps({"beetle_redis_wait_replicas": 1})}
    worker = eo_worker(redis=redis_sentinel.url, pool="prefork", concurrency=2, extra_env=conf)
    app = client()
    app.tasks["eo.record"].delay(0)
    assert wait_until(lambda: counts([worker])[0] == 1, timeout=20)
    old = redis_sentinel.kill_master()
    redis_sentinel.wait_failover(old)
    items = list(range(1, 11))
    for item in items:
        app.tasks["eo.record"].delay(item)
    assert wait_until(lambda: _store_lines(worker.log_text())[0], timeout=20)
    time.sleep(3)  # the new master without a replica: a probe that does not wait resumes
    assert _store_lines(worker.log_text())[1] == [], worker.log_text()[-4000:]
    redis_sentinel.rejoin(old)
    assert wait_until(lambda: set(counts([worker])) == {0, *items}, timeout=60)
    assert counts([worker], "start") == dict.fromkeys([0, *items], 1)
    log = worker.log_text()
    began, ended = _store_lines(log)
    assert (len(began), len(ended)) == (1, 1), log[-4000:]
    assert "Traceback" not in log, _around(log, "Traceback")
