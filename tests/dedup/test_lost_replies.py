"""A reply the client never gets, from a real Redis: the write was applied all the same.

A TCP proxy forwards the store's commands to Redis but holds Redis's replies, so the client
times out on a command the server has run. Retried under the same owner (a claim) or token
(a failure), the write must be recognised as the client's own: a lost claim reply must not
burn an attempt, and a lost reply of the claim that used up the attempts must still hand the
caller the dead letter to publish (not call it a duplicate, which would drop the message with
no dead letter anywhere).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from celery_beetle.store import RedisStore
from celery_beetle.store.outcome import Claim, Failure, Limits
from celery_beetle.store.state import MessageFacts, Status
from celery_beetle.testing.proxy import TcpProxy
from celery_beetle.testing.redis_server import RedisServer

pytestmark = pytest.mark.integration

LIMITS = Limits(lease_timeout_ms=60_000, attempts=1, exceptions=0)


@pytest.fixture
def through_proxy(redis_server: RedisServer) -> Iterator[tuple[RedisStore, RedisStore, TcpProxy]]:
    """(a store whose replies a proxy can hold, a direct store on the same Redis, the proxy)"""
    proxy = TcpProxy(redis_server.host, redis_server.port).start()
    url = f"redis://127.0.0.1:{proxy.port}/9"
    held = RedisStore.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    direct = RedisStore.from_url(f"redis://{redis_server.host_port}/9")
    warm = _facts("warm-up")  # the server knows the scripts: EVALSHA, not a NOSCRIPT reply
    direct.fail(warm, direct.claim(warm, LIMITS, "w").token, LIMITS, False, "w")
    direct.release(warm, 0, "w")
    direct.dead_lettered(warm)
    try:
        yield held, direct, proxy
    finally:
        proxy.close()
        held.close()
        direct.close()


def _lose_the_reply(store: RedisStore, proxy: TcpProxy, call) -> None:
    store.client.ping()  # the connection exists before replies are held
    proxy.hold_replies()
    with pytest.raises(redis.exceptions.TimeoutError):
        call()
    proxy.restore()


def _facts(name: str) -> MessageFacts:
    return MessageFacts("celery", f"{name}-{time.time_ns()}", int(time.time() * 1000) + 600_000)


def test_a_claim_whose_reply_was_lost_is_the_owners_own_when_retried(through_proxy):
    held, direct, proxy = through_proxy
    facts = _facts("lost-claim")
    _lose_the_reply(held, proxy, lambda: held.claim(facts, LIMITS, "run-a"))
    state = direct.peek(facts.queue, facts.message_id)
    assert state is not None and state.status is Status.RUNNING, "the server applied it"
    again = held.claim(facts, LIMITS, "run-a")
    assert (again.outcome, again.token, again.attempt) == (Claim.ACQUIRED, 1, 1)
    assert held.complete(facts, again.token).ok


def test_the_lost_reply_of_the_exhausting_claim_still_hands_over_the_dead_letter(through_proxy):
    held, direct, proxy = through_proxy
    facts = _facts("lost-exhausted")
    short = Limits(lease_timeout_ms=1, attempts=1)
    direct.claim(facts, short, "crashed-run")
    time.sleep(0.01)  # its lease ran out: the attempt is used up
    _lose_the_reply(held, proxy, lambda: held.claim(facts, short, "run-b"))
    again = held.claim(facts, short, "run-b")
    assert (again.outcome, again.reason) == (Claim.DEAD_LETTER, "attempts_limit")
    assert direct.dead_lettered(facts) is True


def test_a_failure_whose_reply_was_lost_gets_the_same_answer_again(through_proxy):
    held, direct, proxy = through_proxy
    facts = _facts("lost-failure")
    limits = Limits(lease_timeout_ms=60_000, attempts=3, exceptions=2, delay_ms=1_000)
    token = direct.claim(facts, limits, "run-c").token
    _lose_the_reply(held, proxy, lambda: held.fail(facts, token, limits, True, "run-c"))
    again = held.fail(facts, token, limits, True, "run-c")
    assert again.outcome is Failure.RETRY and again.exceptions == 1
    state = direct.peek(facts.queue, facts.message_id)
    assert state is not None and state.exceptions == 1, "counted once"
