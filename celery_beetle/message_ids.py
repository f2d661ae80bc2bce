"""The ``message_id`` a BeetleTask's publish gets: one per publish, the same on every copy.

A message is a publish, not a task id: applying one frozen signature twice (the same task
id) publishes two messages, and both run. The twin copy of one publish, a broker's
redelivery of it and kombu's own retry of a publish that failed carry the id this module
gave it once, so they run once. The rules, by who publishes:

* a caller's own ``message_id`` (an outbox row, an idempotency key) is kept: publishing it
  again is a duplicate;
* a new task (``delay()``, no task id given): a new random id, which is its task id too;
* a client publishing a given task id (a frozen signature), outside any run: a new random
  id per publish;
* a run (in a worker, a task the run publishes: a chain's next link, a callback, a chord's
  body, an errback): an id derived from the running message's identity ``(scope,
  message_id)``, the task id and how many times this run published that task id before.
  A run taken over after a crash publishes the same ids again, which are dropped as
  duplicates, while two different runs (two applies of one frozen chord) publish two
  messages;
* a run publishing its own task id again (``self.retry()``, ``self.replace()``): the
  running message's id without its suffixes, then ``:replace-N`` (Celery's
  ``replaced_task_nesting``) and ``:retry-N`` (Celery's ``retries``), as the previous
  release did on the task id, so a retry published by a run and again by its take-over is
  one message.

A message of the previous release carries its task id as its ``message_id``; the worker
deduplicates it on that id as before, and its retries keep their ``<task id>:retry-N``.

:May import: ``celery_beetle.worker``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``, ``celery_beetle.metrics``, ``celery_beetle.censor``
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from celery_beetle.worker.facts import FACTS_HEADER, facts_from_headers

__all__ = ["message_id_for", "publish_message_id"]

#: the namespace of the ids a run derives (a UUIDv5 of the run's identity and the task id)
NAMESPACE = uuid.UUID("5b7c1f0e-3c1a-4d2e-9a57-8f0b6e2d4c11")

#: the suffixes :func:`message_id_for` adds, stripped from a running message's id
_SUFFIXES = re.compile(r"(:replace-\d+)?(:retry-\d+)?$")

#: where a run's request keeps how many times it published each task id
_COUNTS_ATTRIBUTE = "_beetle_published"


def publish_message_id(app: Any, task_id: str | None, options: dict[str, Any]) -> str:
    """The ``message_id`` of one publish of ``task_id`` with Celery's ``options`` (see the
    module's rules); a caller's ``message_id`` in ``options`` is the caller's to keep.

    With no ``task_id`` (``delay()``), the publish is a new task: its new id is both its task
    id and its ``message_id``."""
    request = _running_request(app) if task_id else None
    if request is None or not task_id:
        return str(uuid.uuid4())
    scope, running_id = _running_identity(request)
    if task_id == getattr(request, "id", None):
        base = _SUFFIXES.sub("", running_id) or running_id
        return message_id_for(base, options.get("retries"), options.get("replaced_task_nesting"))
    counts = getattr(request, _COUNTS_ATTRIBUTE, None)
    if not isinstance(counts, dict):
        counts = {}
        setattr(request, _COUNTS_ATTRIBUTE, counts)
    counts[task_id] = ordinal = counts.get(task_id, 0) + 1
    return str(uuid.uuid5(NAMESPACE, "\0".join((scope, running_id, task_id, str(ordinal)))))


def message_id_for(base: str, retries: Any = None, replaced: Any = None) -> str:
    """``base`` with the suffixes of a Celery retry (``:retry-N``) and replacement
    (``:replace-N``): the id of a run's republish of its own task id."""
    message_id = base
    if replaced:
        message_id = f"{message_id}:replace-{int(replaced)}"
    if retries:
        message_id = f"{message_id}:retry-{int(retries)}"
    return message_id


def _running_request(app: Any) -> Any:
    """The request of the task this worker process runs now (not one called directly or
    eagerly), or None outside a run."""
    task = app.current_worker_task
    if task is None:
        return None
    request = task.request
    if request is None or request.called_directly or request.is_eager:
        return None
    return request if request.delivery_info else None


def _running_identity(request: Any) -> tuple[str, str]:
    """The running message's dedup identity ``(scope, message_id)``: what the gate found,
    else what the request carries (a plain task's message)."""
    facts = facts_from_headers(getattr(request, FACTS_HEADER, None))
    if facts is not None:
        return facts.scope or facts.queue, facts.message_id
    properties = getattr(request, "properties", None) or {}
    queue = (request.delivery_info or {}).get("routing_key") or ""
    return str(queue), str(properties.get("message_id") or request.id)
