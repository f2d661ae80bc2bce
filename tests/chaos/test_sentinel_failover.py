"""The dedup store's master dies under load and a Sentinel promotes its replica.

Workers and the publisher use the ``redis+sentinel://`` URL, so they find the new master by
themselves; no worker is restarted. Replication is asynchronous: a claim or completion the
old master acknowledged but never sent to its replica is missing on the new master, and its
message runs again. So the replica is cut off for half a second before the kill, as a lagging
replica would be (without the setting below that ran 1-5 messages twice in 8 of 9 runs), and
the workers set ``beetle_redis_wait_replicas=1``: every write waits for the replica's ack
(``WAIT`` in the same round trip) or counts as not stored. The old master rejoins as a
replica, because with ``WAIT 1`` no write counts while the new master has none.

The lease is 10 s, not the suite's 4 s: a task whose completion waits out the failover must
still own its message when the store answers again (with the default 300 s it always does).
Judged by the audit: 0 lost, 0 duplicated, 0 unexpected.
"""

from __future__ import annotations

from tests.chaos.conftest import judge


def test_a_sentinel_failover_with_a_lagging_replica_runs_every_message_once(
    chaos, brokers, spark, messages, redis_sentinel
):
    run = chaos(
        "redis failover, lagging replica",
        redis=redis_sentinel.url,
        conf={"beetle_redis_wait_replicas": 1},
        task_options={"timeout": 10},
    )
    workers = run.begin(messages)
    old = redis_sentinel.kill_master(unreplicated_s=0.5)
    new = redis_sentinel.wait_failover(old)
    assert new is not old
    redis_sentinel.rejoin(old)
    assert run.wait_all_done(timeout=120) == set()
    assert all(worker.alive() for worker in workers)  # resumed by themselves, not restarted
    judge(run, spark)
