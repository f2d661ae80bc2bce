"""The dedup store: one record per message in Redis, the rules that change it, its fake.

===================  ===================================================================
``base``             :class:`~.base.Store`: what the worker needs of a store, one method
                     per rule
``redis``            :class:`~.redis.RedisStore`: one Lua script per state change, one
                     round trip each
``fake``             :class:`~.fake.FakeStore`: the same rules over a dict, for tests
``outcome``          the rules: pure functions from (stored record, message, limits, now)
                     to a decision and the record to write
``decisions``        what they take and answer: :class:`~.decisions.Limits`, and one enum
                     and one decision per step
``state``            the record's fields (:class:`~.state.State`) and a delivery's
                     identity (:class:`~.state.MessageFacts`)
``keys``             the record's Redis key, one per ``(scope, message_id)``
``backoff``          the retry delay, the same in Python and in ``scripts/fail.lua``
``health``           which errors mean "the store is unavailable", and a cheap probe
``address``          the store's URL forms, parsed and connected to
``scripts/*.lua``    one script per state change, each applying one rule atomically
===================  ===================================================================

``from celery_beetle.store import RedisStore`` (and the other names of ``__all__``) works
as it did when this was one module.

The store sits below everything else of ``celery_beetle``: the rules know nothing of Celery,
so they are tested without Redis and without a worker. ``tests/unit/test_import_rules.py``
checks:

:May import: ``kombu_beetle``
:Not imported by: ``kombu_beetle``
"""

from __future__ import annotations

from celery_beetle.store.address import connect
from celery_beetle.store.base import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_TTL_MARGIN_MS,
    REPLAY_MARK_TTL_MS,
    Store,
    wall_clock_ms,
)
from celery_beetle.store.fake import FakeStore
from celery_beetle.store.redis import (
    DEFAULT_WAIT_TIMEOUT_MS,
    RedisStore,
    ReplicaAckTimeout,
    ScriptCall,
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
