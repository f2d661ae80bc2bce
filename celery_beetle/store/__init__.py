"""The dedup store: one record per message in Redis, the rules that change it, its fake.

``from celery_beetle.store import RedisStore`` works as it did when this was one module.
"""

from __future__ import annotations

from celery_beetle.store.fake import FakeStore
from celery_beetle.store.redis import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_TTL_MARGIN_MS,
    DEFAULT_WAIT_TIMEOUT_MS,
    REPLAY_MARK_TTL_MS,
    RedisStore,
    ReplicaAckTimeout,
    ScriptCall,
    Store,
    connect,
    wall_clock_ms,
)

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_TTL_MARGIN_MS",
    "DEFAULT_WAIT_TIMEOUT_MS",
    "REPLAY_MARK_TTL_MS",
    "FakeStore",
    "RedisStore",
    "ReplicaAckTimeout",
    "ScriptCall",
    "Store",
    "connect",
    "wall_clock_ms",
]
