"""The identity contract of every dedup store: one record per ``(scope, message_id)``.

Part of the contract suite (the ``store`` fixture runs each test on the in-memory fake and on
Redis): names with ``:``, ``{`` and ``}`` and ids of 255 bytes get a record each, scopes
shared by several queues share it, and a record a worker of the previous version wrote under
its old key is found (:mod:`celery_beetle.store.keys`).
"""

from __future__ import annotations

import pytest

from celery_beetle.store import RedisStore, Store
from celery_beetle.store.fake import FakeStore
from celery_beetle.store.outcome import Claim, Fence, Gate, Limits
from celery_beetle.store.state import MessageFacts, Status
from tests.dedup.conftest import ManualClock

DAY_MS = 86_400_000
LIMITS = Limits(lease_timeout_ms=60_000, attempts=3, exceptions=2)

LONG_ID = "i" * 255
AWKWARD_NAMES = [
    ("a:b", "c"),
    ("a", "b:c"),
    ("a", "b"),
    ("a:b:c", "d"),
    ("{x}", "m"),
    ("x", "{m}"),
    ("}", "m"),
    ("{", "m}"),
    ("q", "{q:m}"),
    ("q{", ":m"),
    ("q", LONG_ID),
    ("q", LONG_ID + "j"),
    ("q:r", LONG_ID),
    ("q", "é" * 128),  # 256 UTF-8 bytes, 128 characters
    ("q", "x" * 200),  # the longest id kept in the key
    ("q", "x" * 201),  # the shortest id named by its hash
    ("s" * 255, "m"),
]


def facts(clock: ManualClock, scope: str, message_id: str, queue: str | None = None):
    return MessageFacts(queue or scope, message_id, clock() + DAY_MS, scope=scope)


class PreviousVersion:
    """A worker of the previous release on the same storage: every record under the old
    key ``<prefix>{<queue>:<message_id>}``, and no old key read besides."""

    @staticmethod
    def of(store: Store) -> Store:
        if isinstance(store, RedisStore):
            old: Store = _PreviousRedisStore(store.client, clock=store.clock)
        else:
            assert isinstance(store, FakeStore)
            old = _PreviousFakeStore(clock=store.clock)
            old.records = store.records
        return old


class _PreviousRedisStore(RedisStore):
    def key(self, scope: str, message_id: str) -> str:
        return f"{self.key_prefix}{{{scope}:{message_id}}}"

    def legacy_key(self, scope: str, message_id: str) -> str | None:
        return None


class _PreviousFakeStore(FakeStore):
    key = _PreviousRedisStore.key
    legacy_key = _PreviousRedisStore.legacy_key


def test_awkward_names_each_get_a_record_of_their_own(store, clock):
    for scope, message_id in AWKWARD_NAMES:
        msg = facts(clock, scope, message_id)
        assert store.gate(msg).outcome is Gate.RUN, (scope, message_id)
        claim = store.claim(msg, LIMITS, "w1")
        assert claim.acquired, (scope, message_id)
        assert store.complete(msg, claim.token).ok
    for scope, message_id in AWKWARD_NAMES:
        msg = facts(clock, scope, message_id)
        assert store.peek(scope, message_id).status is Status.COMPLETED
        assert store.claim(msg, LIMITS, "w2").outcome is Claim.ALREADY_DONE
        assert store.ttl_ms(scope, message_id) > DAY_MS - 1
    keys = {store.key(scope, message_id) for scope, message_id in AWKWARD_NAMES}
    assert len(keys) == len(AWKWARD_NAMES)
    assert max(len(key) for key in keys) <= len("beetle:") + 462


def test_names_that_shared_a_key_before_are_two_messages(store, clock):
    first, second = facts(clock, "a:b", "c"), facts(clock, "a", "b:c")
    store.complete(first, store.claim(first, LIMITS, "w1").token)
    assert store.gate(second).outcome is Gate.RUN
    assert store.claim(second, LIMITS, "w1").acquired


def test_two_queues_sharing_a_scope_share_the_record(store, clock):
    old, new = facts(clock, "orders", "m-1", "orders"), facts(clock, "orders", "m-1", "orders.v2")
    store.complete(old, store.claim(old, LIMITS, "w1").token)
    assert store.gate(new).outcome is Gate.DROP_DUPLICATE
    assert store.claim(new, LIMITS, "w2").outcome is Claim.ALREADY_DONE


def test_two_scopes_on_one_message_id_are_two_records(store, clock):
    billing, shipping = facts(clock, "billing", "m-1", "q"), facts(clock, "shipping", "m-1", "q")
    store.complete(billing, store.claim(billing, LIMITS, "w1").token)
    assert store.claim(shipping, LIMITS, "w1").acquired


@pytest.mark.parametrize(
    ("scope", "message_id"),
    [("a:b", "c"), ("q", "x:y"), ("{q}", "m"), ("q", LONG_ID)],
    ids=["colon-in-scope", "colon-in-id", "braces", "long-id"],
)
def test_a_record_the_previous_version_wrote_under_the_old_key_is_found(
    store, clock, scope, message_id
):
    old_worker = PreviousVersion.of(store)
    msg = facts(clock, scope, message_id)
    claim = old_worker.claim(msg, LIMITS, "old")
    assert claim.acquired
    assert store.gate(msg).outcome is Gate.DEFER, "the old worker runs it"
    assert store.claim(msg, LIMITS, "new").outcome is Claim.LOCKED
    assert old_worker.complete(msg, claim.token).outcome is Fence.OK
    assert store.gate(msg).outcome is Gate.DROP_DUPLICATE
    assert store.claim(msg, LIMITS, "new").outcome is Claim.ALREADY_DONE


def test_the_new_version_works_on_an_old_record_so_the_old_version_sees_its_writes(store, clock):
    old_worker = PreviousVersion.of(store)
    msg = facts(clock, "a:b", "c")
    first = old_worker.claim(msg, LIMITS, "old")
    assert old_worker.fail(msg, first.token, LIMITS, True, "old").outcome.value == "retry"
    clock.advance(LIMITS.max_delay_ms)
    claim = store.claim(msg, LIMITS, "new")
    assert (claim.outcome, claim.attempt) == (Claim.ACQUIRED, 2)
    assert old_worker.gate(msg).outcome is Gate.DEFER
    assert store.complete(msg, claim.token).ok
    assert old_worker.gate(msg).outcome is Gate.DROP_DUPLICATE


def test_forget_deletes_the_old_record_too(store, clock):
    msg = facts(clock, "a:b", "c")
    PreviousVersion.of(store).claim(msg, LIMITS, "old")
    assert store.forget("a:b", "c") is True
    assert store.peek("a:b", "c") is None


def test_plain_names_keep_the_previous_key_so_both_versions_share_every_record(store, clock):
    old_worker = PreviousVersion.of(store)
    msg = facts(clock, "celery", "6f1c1a52-3b1e-4e0b-9a55-2c1d0c2f7a10")
    assert store.key(msg.scope, msg.message_id) == old_worker.key(msg.scope, msg.message_id)
    claim = store.claim(msg, LIMITS, "new")
    assert old_worker.claim(msg, LIMITS, "old").outcome is Claim.LOCKED
    store.complete(msg, claim.token)
    assert old_worker.gate(msg).outcome is Gate.DROP_DUPLICATE
