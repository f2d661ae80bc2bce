"""LeaseKeeper against a real Redis: a kept lease outlives its timeout, a stopped one ends.

Real time on purpose: what is tested is that the heartbeat thread keeps up with the wall
clock the scripts are given. The lease is 1 s, so the test takes about 3.5 s.
"""

from __future__ import annotations

import uuid

from celery_beetle.store import RedisStore, wall_clock_ms
from celery_beetle.store.outcome import Claim, Limits
from celery_beetle.store.state import MessageFacts
from celery_beetle.testing.waiting import wait_until
from celery_beetle.worker.lease import LeaseKeeper

LIMITS = Limits(lease_timeout_ms=1_000, attempts=2, exceptions=1)


def test_a_kept_lease_is_locked_long_after_its_timeout_and_free_once_stopped_and_ended(
    redis_url,
):
    mine, theirs = RedisStore.from_url(redis_url), RedisStore.from_url(redis_url)
    facts = MessageFacts("orders", f"lease-{uuid.uuid4().hex}", wall_clock_ms() + 60_000)
    claimed_at = wall_clock_ms()
    claim = mine.claim(facts, LIMITS, "worker-1")
    assert claim.outcome is Claim.ACQUIRED
    keeper = LeaseKeeper(mine, facts, claim.token, 1_000, lease_deadline_ms=claim.lease_deadline_ms)
    keeper.start()
    try:
        # 2.5 s after the claim: without the keeper its lease would have ended 1.5 s ago
        assert wait_until(lambda: wall_clock_ms() >= claimed_at + 2_500, timeout=5)
        during = theirs.claim(facts, LIMITS, "worker-2")
    finally:
        keeper.stop()
    after_stop = theirs.claim(facts, LIMITS, "worker-2")
    assert (during.outcome, during.owner) == (Claim.LOCKED, "worker-1")
    assert keeper.extensions >= 3 and not keeper.lost and not keeper.running
    assert after_stop.outcome is Claim.LOCKED, "stopping does not give the lease back early"

    assert wait_until(lambda: wall_clock_ms() > keeper.lease_deadline_ms, timeout=2)
    taken_over = theirs.claim(facts, LIMITS, "worker-2")
    assert (taken_over.outcome, taken_over.attempt) == (Claim.ACQUIRED, 2)
    mine.close()
    theirs.close()
