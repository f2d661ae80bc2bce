"""A wait on the store before the body is never taken from the body's time limits, and a
wait for the outcome after it is never cut short by them.

Under prefork Celery starts a job's time limits as a pool process takes it; a BeetleTask's
run stores its start in Redis before the body. Here a TCP proxy in front of Redis holds the
store's replies for about a second just as the only pool process takes the next job, so
that job's start waits on Redis before its body begins (the fault explorer's seed 90003:
a 2 s body under a 4 s lease, a 3 s soft limit, stopped 1.9 s in). The body must still get
its whole time: the limits count from the stored start, and the lease is renewed once the
held reply arrives, so the hard limit still ends before the lease does.

After the body, a completion the store does not take (its replica frozen, with
``beetle_redis_wait_replicas``) holds the limits back until it is stored (seed 97014).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from celery_beetle.testing.proxy import TcpProxy
from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import celery_queue_empty, take_dead_letters

#: the defaults (attempts=1, exceptions=0) with the explorer's shortest lease: a 3 s soft
#: limit and a 3.5 s hard limit
OPTIONS = {"timeout": 4, "attempts": 1, "exceptions": 0, "retry_delay": 10, "max_delay": 600}
BODY_S = {0: 1.0, 1: 0.5, 2: 2.5}
HELD_S = 1.6  # from item 1's start: item 2's start waits about 1.1 s


@pytest.fixture
def held_redis(redis_url: str) -> Iterator[tuple[str, TcpProxy]]:
    """(a Redis URL through a proxy that can hold the replies, the proxy)"""
    address, db = redis_url.removeprefix("redis://").rsplit("/", 1)
    host, port = address.rsplit(":", 1)
    proxy = TcpProxy(host, int(port)).start()
    try:
        yield f"redis://{proxy.host_port}/{db}", proxy
    finally:
        proxy.close()


def test_a_body_whose_start_waited_on_a_held_redis_reply_still_gets_its_whole_time_limit(
    brokers, client, eo_worker, held_redis
):
    url, proxy = held_redis
    worker = eo_worker(redis=url, pool="prefork", concurrency=1, task_options=OPTIONS)
    record = client(task_options=OPTIONS).tasks["eo.record"]
    record.delay(0, BODY_S[0])
    assert wait_until(lambda: counts([worker], "start")[0] == 1, timeout=20)
    # 1 and 2 wait for the only pool process: the gate reserves them, and stores 1's
    # completion itself; 2's start is the pool's first call to Redis after 1's start
    record.delay(1, BODY_S[1])
    record.delay(2, BODY_S[2])
    assert wait_until(lambda: counts([worker], "start")[1] == 1, timeout=20, interval=0.02)
    proxy.hold_replies()
    time.sleep(HELD_S)
    proxy.restore()
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=30), worker.log_text()[-3000:]
    times = {(event, item): t for event, item, _, t in worker.events()}
    waited = times.get(("start", 2), 0.0) - times[("done", 1)]
    assert waited > 0.7, f"item 2's start did not wait on the held reply ({waited:.2f} s)"
    log = worker.log_text()
    assert "SoftTimeLimitExceeded" not in log and "Hard time limit" not in log, log[-3000:]
    assert counts([worker], "start") == {0: 1, 1: 1, 2: 1}
    assert counts([worker], "done") == {0: 1, 1: 1, 2: 1}, "every body ran to its end"
    assert take_dead_letters(brokers) == {}


#: a 10 s lease: a soft limit at 8 s, a hard one at 9 s, from the stored start
LONG = {"timeout": 10, "attempts": 1, "exceptions": 0, "retry_delay": 10, "max_delay": 600}
#: the replica frozen from the body's start until between the hard limit and the lease's end
FROZEN_UNTIL_S = 9.5


def test_a_completion_waiting_for_a_replica_outlives_the_hard_limit_within_the_lease(
    brokers, client, eo_worker, redis_sentinel
):
    """With ``beetle_redis_wait_replicas`` the pool stores the completion, and Redis takes no
    write while its replica is away (a Sentinel failover: the fault explorer's seed 97014).
    A body that returned as the replica froze waits for its completion past the hard time
    limit (90 % of the lease), and the store takes it before the lease ends: the message
    completes once, rather than its process being killed with the completion unstored and
    the next copy dead-lettering it (attempts=1)."""
    conf = {"BEETLE_TEST_CONF": json.dumps({"beetle_redis_wait_replicas": 1})}
    worker = eo_worker(
        redis=redis_sentinel.url, pool="prefork", concurrency=1, task_options=LONG, extra_env=conf
    )
    record = client(task_options=LONG).tasks["eo.record"]
    replica = redis_sentinel.nodes[1]
    record.delay(1, 1.0)
    assert wait_until(lambda: counts([worker], "start")[1] == 1, timeout=30, interval=0.02)
    replica.pause()
    try:
        started = next(t for e, i, _, t in worker.events() if (e, i) == ("start", 1))
        time.sleep(max(started + FROZEN_UNTIL_S - time.time(), 0))
    finally:
        replica.resume()
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=40), worker.log_text()[-3000:]
    log = worker.log_text()
    assert "Hard time limit" not in log, log[-3000:]
    assert counts([worker], "start") == {1: 1}
    assert counts([worker], "done") == {1: 1}
    assert take_dead_letters(brokers) == {}, log[-3000:]
