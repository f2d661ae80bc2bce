"""Dead letters an operator can list, inspect and replay: the messages in ``<queue>.dead``.

Two kinds land there. Those the worker publishes when it gives a message up, with
``x-beetle-dead-*`` headers (:mod:`celery_beetle.worker.deadletter`); and those a broker
dead-letters through the queue's policy (:mod:`celery_beetle.ops.policies`: expired,
rejected, overflowed, past a delivery limit), with RabbitMQ's ``x-death`` header. Each
broker holds its own copies, so every operation reads ``<queue>.dead`` on every broker of
the URL.

One entry per message: copies are grouped by the message's identity (scope and
``message_id``) and its generation, never by when or where they died. Each broker stamps
``x-death`` with its own clock in whole seconds, so copies of one message expire "at"
different times; a worker's dead letter and a broker's of the same message (one copy given
up, its twin expired) are one message too, and replaying it once covers them all. What
makes two dead letters of one message genuinely distinct is a replay in between: a
replayed message carries ``x-beetle-replay`` (the replay id of the dead letter it came
from), so if it is dead-lettered again, that is a new generation and a new entry. The
replay id (:func:`describe`) is derived from the identity and the generation, so every copy
of one entry, on any broker, read at any time, names the same replay mark.

Browsing takes messages with ``basic.get`` without acking them and closes the channel:
RabbitMQ puts them back where they were, so a listing never loses or reorders one.
``<queue>.dead`` is a classic queue, where a redelivery costs nothing (in a quorum queue
it would count against the delivery limit).

Replaying them is :mod:`celery_beetle.ops.replay`.

A message id may be given by a unique prefix, as listings shorten them
(:func:`resolve_ids`). Reading fails loudly rather than finding nothing: no broker readable
is :class:`NoBrokerReadable`; a queue on none of the brokers read is :class:`QueueNotFound`;
an id that names no dead letter, or more than one, is :class:`DeadLetterNotFound`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import amqp

from celery_beetle.worker.deadletter import PREFIX as DEAD_PREFIX
from celery_beetle.worker.deadletter import dead_letter_queue_name
from kombu_beetle.brokers import BrokerLink
from kombu_beetle.envelope import EXPIRES_AT_HEADER
from kombu_beetle.options import BeetleOptions, build_options
from kombu_beetle.scopes import SCOPE_HEADER

__all__ = [
    "REPLAY_HEADER",
    "Copy",
    "DeadLetter",
    "DeadLetterBrowser",
    "DeadLetterNotFound",
    "NoBrokerReadable",
    "QueueNotFound",
    "describe",
    "list_dead_letters",
    "purge",
    "resolve_ids",
    "select",
    "short_ids",
]

logger = logging.getLogger(__name__)

#: the shortest id prefix a listing shows
SHORT_ID_CHARS = 8


class NoBrokerReadable(ConnectionError):
    """Not one broker of the URL could be read: nothing can be said about its dead letters."""

    def __init__(self, queue: str, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        reasons = "; ".join(f"{broker}: {error}" for broker, error in errors.items())
        super().__init__(f"no broker could be read for {queue}.dead ({reasons})")


class QueueNotFound(LookupError):
    """Neither the queue nor its dead letter queue exists on any broker read."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(
            f"no queue {queue!r} (nor {queue}.dead) on any broker: check the name "
            f"(beetle status -Q {queue} shows a queue's depth on every broker)"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class DeadLetterNotFound(LookupError):
    """A message id (or prefix) names no dead letter of the queue, or more than one."""

    def __str__(self) -> str:
        return str(self.args[0])


#: headers RabbitMQ adds when it dead-letters a message
BROKER_DEATH_HEADERS = (
    "x-death",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
)
#: header of a replayed message: the replay id of the dead letter it came from (its
#: generation: see the module docstring)
REPLAY_HEADER = "x-beetle-replay"
#: most dead letters read from one broker in one go
DEFAULT_LIMIT = 10_000
_MAX_ARGUMENTS_CHARS = 2_000


@dataclass(frozen=True)
class Copy:
    """One copy of a dead letter: on which broker, under which delivery tag (while held)."""

    broker: str
    delivery_tag: int


@dataclass
class DeadLetter:
    """One dead letter, however many brokers hold a copy of it."""

    message_id: str | None
    #: the queue it came from: where a replay sends it
    queue: str
    scope: str
    replay_id: str
    reason: str
    body: bytes
    content_type: str
    content_encoding: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    copies: list[Copy] = field(default_factory=list)

    @property
    def brokers(self) -> list[str]:
        return sorted({c.broker for c in self.copies})

    @property
    def task(self) -> str | None:
        task = self.headers.get("task")
        return str(task) if task is not None else None

    @property
    def expires_at_ms(self) -> int | None:
        """When the message expires (unix ms): its dedup window ends then, and a record of a
        run lives until then plus the workers' margin. None if it carries no valid expiry."""
        value = self.headers.get(DEAD_PREFIX + "expires-at", self.headers.get(EXPIRES_AT_HEADER))
        try:
            seconds = float(_text(value) or "nan")
        except ValueError:
            return None
        return int(seconds * 1000) if math.isfinite(seconds) and seconds > 0 else None

    @property
    def from_worker(self) -> bool:
        """A worker's dead letter (a give-up, with its reasons), not a broker's."""
        return DEAD_PREFIX + "reason" in self.headers

    @property
    def dead_at_ms(self) -> int | None:
        at = self.headers.get(DEAD_PREFIX + "at")
        if at is not None:
            return int(at)
        death = _latest_death(self.headers)
        when = death.get("time") if death else None
        if isinstance(when, datetime):
            return int(when.timestamp() * 1000)
        return None

    def summary(self) -> dict[str, Any]:
        """What ``beetle dead-letters list`` shows of it (JSON-ready)."""
        h = self.headers
        return {
            "message_id": self.message_id,
            "task": self.task,
            "task_id": _text(h["id"]) if h.get("id") else None,
            "queue": self.queue,
            "scope": self.scope,
            "reason": self.reason,
            "exception": _text(h.get(DEAD_PREFIX + "exception")),
            "message": _text(h.get(DEAD_PREFIX + "message")),
            "attempts": h.get(DEAD_PREFIX + "attempts"),
            "exceptions": h.get(DEAD_PREFIX + "exceptions"),
            "dead_at_ms": self.dead_at_ms,
            "expires_at_ms": self.expires_at_ms,
            "worker": _text(h.get(DEAD_PREFIX + "worker")),
            "brokers": self.brokers,
            "replay_id": self.replay_id,
        }

    def details(self) -> dict[str, Any]:
        """Everything about it, for ``beetle dead-letters show``: the summary, the
        traceback, the arguments (cut at 2,000 characters) and every header."""
        return {
            **self.summary(),
            "traceback": _text(self.headers.get(DEAD_PREFIX + "traceback")),
            "arguments": self.arguments(),
            "content_type": self.content_type,
            "headers": {k: _jsonable(v) for k, v in sorted(self.headers.items())},
        }

    def arguments(self, limit: int = _MAX_ARGUMENTS_CHARS) -> str:
        """The task's ``(args, kwargs)`` as text (a Celery protocol 2 JSON body), or the
        body itself; cut at ``limit`` characters."""
        text = self.body.decode("utf-8", "replace")
        if self.content_type == "application/json":
            try:
                decoded = json.loads(text)
                if isinstance(decoded, list) and len(decoded) >= 2:
                    text = json.dumps({"args": decoded[0], "kwargs": decoded[1]})
            except ValueError:
                pass
        if len(text) > limit:
            return text[:limit] + f"... ({len(text) - limit} more characters)"
        return text


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _latest_death(headers: Mapping[str, Any]) -> Mapping[str, Any] | None:
    deaths = headers.get("x-death")
    if isinstance(deaths, (list, tuple)) and deaths and isinstance(deaths[0], Mapping):
        return deaths[0]  # RabbitMQ puts the latest death first: the queue it died in here
    return None


def describe(
    dead_queue: str, headers: Mapping[str, Any], message_id: str | None
) -> tuple[str, str, str, str]:
    """``(queue, scope, reason, replay id)`` of a dead letter from its headers. Pure.

    The replay id names the message's generation (scope, ``message_id`` and the replay it
    came from), the same for every copy however and whenever it died; without a
    ``message_id`` (nothing to group by) it names this death."""
    base = dead_queue[: -len(".dead")] if dead_queue.endswith(".dead") else dead_queue
    if DEAD_PREFIX + "reason" in headers:  # the worker's
        queue = _text(headers.get(DEAD_PREFIX + "queue")) or base
        scope = _text(headers.get(DEAD_PREFIX + "scope")) or queue
        reason = _text(headers[DEAD_PREFIX + "reason"]) or "?"
        death = [
            _text(headers.get(DEAD_PREFIX + "at")),
            _text(headers.get(DEAD_PREFIX + "worker")),
        ]
    else:  # the broker's, through the queue's policy
        first = _latest_death(headers) or {}
        queue = _text(first.get("queue")) or _text(headers.get("x-first-death-queue")) or base
        scope = _text(headers.get(SCOPE_HEADER)) or queue
        reason = "broker:" + (_text(first.get("reason")) or "unknown")
        death = [_text(first.get(k)) for k in ("queue", "reason", "time", "count")]
    if message_id:
        death = ["generation", _text(headers.get(REPLAY_HEADER)) or ""]
    text = "\0".join([scope, message_id or "", *(d or "" for d in death)])
    return queue, scope, reason, hashlib.sha256(text.encode()).hexdigest()[:16]


class DeadLetterBrowser:
    """Reads ``<queue>.dead`` on every broker and holds what it read, unacked, until
    :meth:`ack` removes a dead letter's copies or :meth:`close` puts the rest back."""

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        transport_options: Mapping[str, Any] | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> None:
        self.options: BeetleOptions = build_options(
            url, {"connect_timeout": 2.0, **(transport_options or {})}
        )
        self.queue = queue
        self.dead_queue = dead_letter_queue_name(queue)
        self.limit = limit
        #: broker -> why it could not be read
        self.errors: dict[str, str] = {}
        self._channels: dict[str, Any] = {}
        self._connections: list[Any] = []

    def __enter__(self) -> DeadLetterBrowser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self) -> list[DeadLetter]:
        """Every dead letter of the queue, copies grouped, oldest first."""
        letters: dict[tuple[str, str, str], DeadLetter] = {}
        found = False
        for address in self.options.all_brokers:
            try:
                conn = BrokerLink(address, self.options).connect()
            except Exception as exc:
                self.errors[address.name] = f"{type(exc).__name__}: {exc}"
                continue
            self._connections.append(conn)
            channel = conn.channel()
            self._channels[address.name] = channel
            for _ in range(self.limit):
                try:
                    message = channel.basic_get(self.dead_queue, no_ack=False)
                except amqp.exceptions.NotFound:
                    self._channels[address.name] = conn.channel()  # a 404 closes the channel
                    break
                found = True
                if message is None:
                    break
                self._add(letters, address.name, message)
        if not self._connections:
            raise NoBrokerReadable(self.queue, self.errors)
        if not found and not self.errors and not self.queue_exists(self.queue):
            raise QueueNotFound(self.queue)
        return sorted(letters.values(), key=lambda d: (d.dead_at_ms or 0, d.message_id or ""))

    def _add(self, letters: dict[tuple[str, str, str], DeadLetter], broker: str, msg: Any) -> None:
        properties = dict(msg.properties or {})
        headers = dict(properties.pop("application_headers", None) or {})
        message_id = properties.get("message_id")
        message_id = _text(message_id) if message_id else None
        queue, scope, reason, replay_id = describe(self.dead_queue, headers, message_id)
        copy = Copy(broker, msg.delivery_info["delivery_tag"])
        key = (scope, message_id or f"{broker}#{copy.delivery_tag}", replay_id)
        known = letters.get(key)
        if known is not None and (known.from_worker or DEAD_PREFIX + "reason" not in headers):
            known.copies.append(copy)
            return
        # the first copy, or a worker's dead letter where a broker's was read first: the
        # worker's says why (exception, attempts), so the entry shows it
        body = msg.body if isinstance(msg.body, bytes) else str(msg.body).encode()
        letters[key] = DeadLetter(
            message_id=message_id,
            queue=queue,
            scope=scope,
            replay_id=replay_id,
            reason=reason,
            body=body,
            content_type=str(properties.get("content_type") or "application/data"),
            content_encoding=str(properties.get("content_encoding") or "binary"),
            headers=headers,
            properties={
                k: properties[k]
                for k in ("message_id", "correlation_id", "reply_to", "priority")
                if properties.get(k)
            },
            copies=[*(known.copies if known is not None else ()), copy],
        )

    def ack(self, letter: DeadLetter) -> None:
        """Remove every copy of ``letter`` from the brokers that hold one."""
        for copy in letter.copies:
            self._channels[copy.broker].basic_ack(copy.delivery_tag)

    def queue_exists(self, queue: str) -> bool:
        """Does ``queue`` exist on at least one reachable broker?"""
        for conn in self._connections:
            channel = conn.channel()
            try:
                channel.queue_declare(queue, passive=True)
                return True
            except amqp.exceptions.NotFound:
                continue
            finally:
                if channel.is_open:
                    channel.close()
        return False

    def close(self) -> None:
        """Close every connection: the dead letters not acked go back where they were."""
        for conn in self._connections:
            try:
                conn.close()
            except Exception:  # the broker went away: it requeues them itself
                conn.collect()
        self._connections.clear()
        self._channels.clear()


def list_dead_letters(
    url: str, queue: str, *, transport_options: Mapping[str, Any] | None = None
) -> tuple[list[DeadLetter], dict[str, str]]:
    """``(dead letters, {broker: error})`` of ``queue``; nothing is removed."""
    with DeadLetterBrowser(url, queue, transport_options=transport_options) as browser:
        return browser.fetch(), browser.errors


def short_ids(letters: Iterable[DeadLetter], at_least: int = SHORT_ID_CHARS) -> dict[str, str]:
    """``{message id: its shortest prefix of at least at_least characters that names no
    other id of letters}``, as a listing shows it (like git's abbreviated hashes)."""
    ids = sorted({d.message_id for d in letters if d.message_id})
    short = {}
    for index, message_id in enumerate(ids):
        length = at_least
        for neighbour in ids[max(index - 1, 0) : index + 2]:
            if neighbour != message_id:
                common = len(_common_prefix(message_id, neighbour))
                length = max(length, common + 1)
        short[message_id] = message_id[:length]
    return short


def _common_prefix(a: str, b: str) -> str:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return a[:index]
    return a[: min(len(a), len(b))]


def resolve_ids(letters: Iterable[DeadLetter], ids: Sequence[str], queue: str) -> list[str]:
    """The full message ids that ``ids`` name: each a whole message id, a Celery task id
    (every message of that task) or a prefix of exactly one message id of ``letters``;
    :class:`DeadLetterNotFound` names the first that is none of them."""
    letters = list(letters)
    known = sorted({d.message_id for d in letters if d.message_id})
    of_task: dict[str, list[str]] = {}
    for d in letters:
        task_id = d.headers.get("id")
        if task_id and d.message_id:
            of_task.setdefault(str(_text(task_id)), []).append(d.message_id)
    resolved = []
    for given in ids:
        if given in known:
            resolved.append(given)
            continue
        if given in of_task:
            resolved.extend(sorted(set(of_task[given])))
            continue
        matches = [message_id for message_id in known if message_id.startswith(given)]
        if not matches:
            raise DeadLetterNotFound(
                f"no dead letter {given!r} in {queue}.dead (replayed or purged already? "
                f"beetle dead-letters list -Q {queue} shows what is there)"
            )
        if len(matches) > 1:
            shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise DeadLetterNotFound(
                f"{given!r} is the start of {len(matches)} dead letters' ids in "
                f"{queue}.dead ({shown}): give more characters"
            )
        resolved.append(matches[0])
    return resolved


def select(
    letters: Iterable[DeadLetter],
    *,
    ids: Sequence[str] = (),
    task: str | None = None,
    everything: bool = False,
    dead_before_ms: int | None = None,
    queue: str = "the queue",
) -> list[DeadLetter]:
    """The dead letters a replay (or purge) names: by message id (or a unique prefix of
    one, :func:`resolve_ids`), by task, or all; with ``dead_before_ms``, only among those
    that died before then."""
    if not (ids or task or everything or dead_before_ms is not None):
        raise ValueError("name the dead letters: message ids, a task, an age, or all of them")
    letters = list(letters)
    wanted = set(resolve_ids(letters, ids, queue)) if ids else set()
    named = ids or task or everything
    return [
        d
        for d in letters
        if (
            not named
            or everything
            or d.message_id in wanted
            or (task is not None and d.task == task)
        )
        and (dead_before_ms is None or (d.dead_at_ms is not None and d.dead_at_ms < dead_before_ms))
    ]


def purge(
    url: str,
    queue: str,
    *,
    ids: Sequence[str] = (),
    task: str | None = None,
    everything: bool = False,
    dead_before_ms: int | None = None,
    dry_run: bool = False,
    transport_options: Mapping[str, Any] | None = None,
) -> list[DeadLetter]:
    """Remove the named dead letters of ``queue`` from every broker (all their copies);
    returns them. Nothing else is touched: the rest go back where they were."""
    with DeadLetterBrowser(url, queue, transport_options=transport_options) as browser:
        chosen = select(
            browser.fetch(),
            ids=ids,
            task=task,
            everything=everything,
            dead_before_ms=dead_before_ms,
            queue=queue,
        )
        if not dry_run:
            for letter in chosen:
                browser.ack(letter)
        return chosen
