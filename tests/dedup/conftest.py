"""Fixtures for the dedup-store contract suite: one suite, every store implementation.

``store`` is parametrized over the in-memory :class:`~celery_beetle.store.fake.FakeStore` and
:class:`~celery_beetle.store.redis.RedisStore` on a real, flushed Redis (the project-wide
``redis_url`` fixture: a throwaway ``redis-server``, never the machine's own). Both read a
manual clock, so leases and retry delays run out without sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_beetle.store import RedisStore, Store, wall_clock_ms
from celery_beetle.store.fake import FakeStore


class ManualClock:
    """Milliseconds that move only when a test says so."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall_clock_ms())


@pytest.fixture(params=["fake", "redis"])
def store(request: pytest.FixtureRequest, clock: ManualClock) -> Iterator[Store]:
    if request.param == "fake":
        yield FakeStore(clock=clock)
        return
    redis_store = RedisStore.from_url(request.getfixturevalue("redis_url"), clock=clock)
    yield redis_store
    redis_store.close()
