"""What the worker needs of a BeetleTask, and where a run in a pool process finds its parts.

=======================  ===================================================================
:class:`RunnableTask`    the protocol a BeetleTask meets (the task module imports this one)
:func:`is_beetle_task`   whether a task is a BeetleTask, read from its class
:func:`process_store`    this process's store: pool processes never share a parent's sockets
:func:`request_facts`    the dedup identity of the running message, as the gate found it
=======================  ===================================================================
"""

from __future__ import annotations

import os
from typing import Any, Protocol, TypeGuard

from celery_beetle.settings import BeetleSettings
from celery_beetle.store import RedisStore, wall_clock_ms
from celery_beetle.store.state import MessageFacts
from celery_beetle.worker.facts import FACTS_HEADER, facts_from_headers, message_facts

__all__ = ["RunnableTask", "is_beetle_task", "process_store", "request_facts"]


class RunnableTask(Protocol):
    """What the worker needs of a BeetleTask: :class:`~celery_beetle.task.BeetleTask` hands
    itself to :class:`~.run.Run`, and the gate step finds such tasks by :func:`is_beetle_task`
    (the task module imports this one, never the other way round)."""

    name: str
    app: Any

    @property
    def beetle_settings(self) -> BeetleSettings: ...

    def apply_beetle_time_limits(self) -> None: ...

    def run(self, *args: Any, **kwargs: Any) -> Any: ...


def is_beetle_task(task: Any) -> TypeGuard[RunnableTask]:
    """Is ``task`` a BeetleTask (an instance of it or of a subclass)? Read from its class,
    so that a property is never run to find out."""
    return callable(getattr(type(task), "apply_beetle_time_limits", None))


_stores: dict[tuple[Any, ...], RedisStore] = {}


def process_store(settings: BeetleSettings) -> RedisStore:
    """This process's store: pool processes must not share a parent's Redis sockets."""
    key = (os.getpid(), settings.redis_url, settings.key_prefix, settings.key_ttl_margin_ms)
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = RedisStore.from_settings(settings)
    return store


def request_facts(request: Any, settings: BeetleSettings) -> MessageFacts:
    """The dedup identity of the running message: what the gate found, or (no gate
    installed) the same rules applied to what the request carries."""
    facts = facts_from_headers(getattr(request, FACTS_HEADER, None))
    if facts is not None:
        return facts
    properties = getattr(request, "properties", None) or {}
    queue = (request.delivery_info or {}).get("routing_key") or "celery"
    message_id = properties.get("message_id") or request.id
    headers = properties.get("application_headers") or {}
    now = wall_clock_ms()
    scope = settings.scope_of(queue)
    return message_facts(queue, str(message_id), headers, settings.message_ttl_ms, now, scope)
