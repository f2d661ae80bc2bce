"""Testing BeetleTasks against real servers under faults: the pytest plugin's parts.

- ``rabbit``, ``redis_server``: throwaway RabbitMQ nodes and Redis servers from the
  installed binaries, each on its own ports and data dir, so a test can kill -9, SIGSTOP or
  restart them by pid; ``containers`` has the same two in containers (testcontainers),
  and ``servers`` chooses between them once per session.
- ``worker``: a ``celery worker`` subprocess, killable by pid; ``app`` points the
  user's app at a test's servers; ``redis_faults``: a Redis that refuses writes.
- ``nodes``: pytest-celery's setup, broker cluster, backend and worker classes carrying
  them; ``verdict``: the exactly-once assertion on a test's trace.
- The fixtures are in :mod:`celery_beetle.pytest_plugin`.

Nothing is imported here until asked for (``from celery_beetle.testing import X`` works for
the names in ``__all__``), so the servers can be used without pytest-celery's imports.

The testing wing may use every other (it runs the real thing), and only the plugin and
tests import it (``tests/unit/test_import_rules.py`` checks):

:May import: anything
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``, ``celery_beetle.metrics``, ``celery_beetle.censor``,
    ``celery_beetle.task``, ``celery_beetle.ops``, ``celery_beetle.outbox``,
    ``celery_beetle.audit``, ``celery_beetle.contrib``, ``celery_beetle.cli``
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "RabbitNode": "rabbit",
    "RabbitNodeError": "rabbit",
    "BrokerSet": "rabbit",
    "beetle_url": "rabbit",
    "RedisServer": "redis_server",
    "RedisServerError": "redis_server",
    "WorkerProcess": "worker",
    "refusing_writes": "redis_faults",
    "wait_until": "waiting",
    "free_port": "ports",
    "BeetleBroker": "nodes",
    "BeetleBrokerCluster": "nodes",
    "BeetleStore": "nodes",
    "BeetleTestSetup": "nodes",
    "BeetleWorker": "nodes",
    "ExactlyOnceError": "verdict",
    "assert_exactly_once": "verdict",
    "judge_trace": "verdict",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
