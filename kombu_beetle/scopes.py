"""Dedup scopes: the logical queue a message's dedup record belongs to.

A worker deduplicates a delivery under ``(scope, message_id)``. The scope of a queue is the
queue's own name unless a mapping says otherwise, so that:

- the old and the new physical queue of a live migration (both consumed during a blue-green
  deploy) share one scope, and a message in both runs once;
- two queues bound to one fan-out exchange (two consumers, two logical queues) keep their own
  scopes, and each runs the message once.

The mapping is ``{physical queue: scope}``; a queue it does not name is its own scope. It is
given to the worker as ``beetle_dedup_scopes`` and to the transport as the ``dedup_scopes``
option (``celery_beetle.install`` copies the one to the other), so that publishers and
workers name the same scope in their trace events. Both accept a dict or the string form
``"orders=orders,orders.v2=orders"``.

A queue named ``<queue>.beetle-migrating`` is the temporary queue of a live migration of
``<queue>`` (``beetle queues migrate``): unless the mapping names it, its scope is the scope
of ``<queue>``, and :func:`home_queue` is ``<queue>``, the queue its retries and dead letters
go back to (the temporary queue is deleted once the migration is done, and a retry or a
replay must not be routed to a queue that no longer exists).

A scope, like a queue name in AMQP, is a non-empty string of at most 255 UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_SCOPE_BYTES",
    "MIGRATING_SUFFIX",
    "SCOPE_HEADER",
    "home_queue",
    "migrating_queue",
    "parse_dedup_scopes",
    "scope_of",
]

#: The longest scope (and queue name: AMQP's shortstr), in UTF-8 bytes.
MAX_SCOPE_BYTES = 255
#: Header of a message a worker republishes (a retry): the scope it ran under.
SCOPE_HEADER = "x-beetle-scope"
#: the temporary queue of a live migration is ``<queue>`` + this
MIGRATING_SUFFIX = ".beetle-migrating"


def parse_dedup_scopes(value: Any) -> dict[str, str]:
    """``{queue: scope}`` from a mapping or from ``"q1=s1,q2=s2"``; a ValueError says which
    entry is wrong and shows the expected form."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        pairs: list[tuple[Any, Any]] = []
        for item in value.split(","):
            if not item.strip():
                continue
            queue, sep, scope = item.partition("=")
            if not sep:
                raise ValueError(
                    f"dedup scopes entry {item.strip()!r} has no '=': expected "
                    f"'queue=scope[,queue=scope...]', e.g. 'orders=orders,orders.v2=orders'"
                )
            pairs.append((queue.strip(), scope.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise ValueError(
            f"dedup scopes must be a dict {{queue: scope}} or a 'queue=scope,...' string, "
            f"got {type(value).__name__}"
        )
    scopes: dict[str, str] = {}
    for queue, scope in pairs:
        _check_name("queue", queue)
        _check_name("scope", scope)
        if queue in scopes and scopes[queue] != scope:
            raise ValueError(
                f"dedup scopes map queue {queue!r} twice ({scopes[queue]!r} and {scope!r})"
            )
        scopes[queue] = scope
    return scopes


def scope_of(scopes: Mapping[str, str], queue: str) -> str:
    """The scope of ``queue``: its mapping, or the queue's own name (for the temporary
    queue of a migration: the scope of the queue it stands in for)."""
    if queue in scopes:
        return scopes[queue]
    home = home_queue(queue)
    return scopes.get(home, home)


def migrating_queue(queue: str) -> str:
    """The temporary queue that holds ``queue``'s messages while it is re-created."""
    return queue + MIGRATING_SUFFIX


def home_queue(queue: str) -> str:
    """``queue``, or for a migration's temporary queue, the queue it stands in for."""
    if queue.endswith(MIGRATING_SUFFIX) and len(queue) > len(MIGRATING_SUFFIX):
        return queue[: -len(MIGRATING_SUFFIX)]
    return queue


def _check_name(what: str, name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"dedup scopes: a {what} must be a non-empty string, got {name!r}")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_SCOPE_BYTES:
        raise ValueError(
            f"dedup scopes: {what} {name[:40]!r}... is {size} UTF-8 bytes; "
            f"at most {MAX_SCOPE_BYTES} (AMQP's limit on a queue name)"
        )
