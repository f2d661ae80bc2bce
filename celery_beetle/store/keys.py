"""Record keys: one Redis key per ``(scope, message_id)``, unambiguous and length-capped.

Until this release the key was ``<prefix>{<queue>:<message_id>}``, which is ambiguous once a
name holds ``:`` (``("a:b", "c")`` and ``("a", "b:c")`` shared a record) and grows with the
id. Keys now take one of three forms (``<prefix>`` is ``beetle:`` by default):

====  ====================================================  ===============================
form  key                                                   when
====  ====================================================  ===============================
A     ``<prefix>{<scope>:<id>}``                            the scope and the id hold none
                                                            of ``:``, ``{``, ``}``, and the
                                                            id is at most 200 characters
B     ``<prefix>{<scope>:<id>}#<len(scope)>``               any other id of at most 200
                                                            characters
C     ``<prefix>{<scope>:<sha256(id) hex>}%<len(scope)>``   an id of more than 200
                                                            characters
====  ====================================================  ===============================

Why each form is injective, and why they never meet: an A key ends with ``}`` and holds
exactly one ``:`` between its braces, so it splits one way; a B or C key ends with ``#`` or
``%`` and digits, which give the scope's length, so it splits one way too (C names the id by
its SHA-256, whose collisions are not a practical concern). Form A is today's key, so a
worker of the previous version and one of this version share the record of every message
whose names are plain (a Celery queue and a UUID id): a rolling deploy changes nothing for
them. A key is at most ``len(prefix) + 462`` characters (a scope of 255).

Form A excludes ids with ``:`` so that the old key of a B or C message (``<prefix>{<scope>:
<id>}``, with the ``:`` inside the scope or the id) is never the A key of another message:
only workers of the previous version ever write an old key. That is what lets this version
read the old key for one release (:func:`legacy_key`): when a B or C message has no record
under its key but one under its old key, that record is the message's, written by a worker of
the previous version, and it is used (and written) there. The previous version's ambiguity
stays for those records only, during the deploy; the release after this one stops reading
old keys (see the CHANGELOG).

Redis Cluster hashes the text between the first ``{`` and the next ``}``. A B key begins
with its old key's text, so both sit in one slot (unless the scope begins with ``}``: an
empty tag hashes the whole key); a C key and its old key do not. The store passes an old key
to a script only when it shares the record's slot.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "MAX_PLAIN_ID_CHARS",
    "decode_key",
    "legacy_key",
    "record_key",
    "record_keys",
    "replay_mark_key",
]

#: Ids longer than this are named by their SHA-256 in the key (form C).
MAX_PLAIN_ID_CHARS = 200
_RESERVED = frozenset(":{}")


def record_key(prefix: str, scope: str, message_id: str) -> str:
    """The key of the record of ``(scope, message_id)``; see the module docstring."""
    if len(message_id) > MAX_PLAIN_ID_CHARS:
        digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{prefix}{{{scope}:{digest}}}%{len(scope)}"
    if _RESERVED.isdisjoint(scope) and _RESERVED.isdisjoint(message_id):
        return f"{prefix}{{{scope}:{message_id}}}"
    return f"{prefix}{{{scope}:{message_id}}}#{len(scope)}"


def record_keys(prefix: str, scope: str, message_id: str) -> tuple[str, str | None]:
    """``(record_key, legacy_key)`` in one pass: the common form A costs one format."""
    if len(message_id) <= MAX_PLAIN_ID_CHARS and (
        _RESERVED.isdisjoint(scope) and _RESERVED.isdisjoint(message_id)
    ):
        return f"{prefix}{{{scope}:{message_id}}}", None
    return record_key(prefix, scope, message_id), f"{prefix}{{{scope}:{message_id}}}"


def replay_mark_key(prefix: str, scope: str, message_id: str) -> str:
    """The key of the message's replay mark (:func:`~celery_beetle.store.outcome.decide_replay`):
    its record's key and ``~replay``, so it shares the record's hash slot, and never is a
    record key (those end in ``}``, or ``#``/``%`` and digits)."""
    return record_key(prefix, scope, message_id) + "~replay"


def legacy_key(prefix: str, scope: str, message_id: str) -> str | None:
    """The key the previous version used for this record, if it is not the record's key
    (forms B and C); read for one release, so that a rolling deploy finds the records of
    workers that still run the previous version."""
    old = f"{prefix}{{{scope}:{message_id}}}"
    return None if old == record_key(prefix, scope, message_id) else old


def decode_key(prefix: str, key: str) -> tuple[str, str, str]:
    """``(scope, id, form)`` of a record key; for form C the id is its SHA-256 hex. The
    inverse of :func:`record_key` (a ValueError for a key it never makes)."""
    if not key.startswith(prefix + "{"):
        raise ValueError(f"{key!r} is not a record key under prefix {prefix!r}")
    rest = key[len(prefix) + 1 :]
    if rest.endswith("}"):
        scope, sep, message_id = rest[:-1].partition(":")
        if sep and _RESERVED.isdisjoint(scope) and _RESERVED.isdisjoint(message_id):
            return scope, message_id, "A"
        raise ValueError(f"{key!r} is not a record key")
    for mark, form in (("#", "B"), ("%", "C")):
        body, sep, length = rest.rpartition(mark)
        if sep and length.isdigit() and body.endswith("}"):
            n = int(length)
            body = body[:-1]
            if len(body) > n and body[n] == ":" and n > 0:
                return body[:n], body[n + 1 :], form
    raise ValueError(f"{key!r} is not a record key")
