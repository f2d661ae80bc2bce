"""The declarations a connection made, replayed on a broker that comes back.

A broker that was down when a queue was declared (or that lost its state) must
get the same exchanges, queues and bindings before it is consumed from or
published to again.  Deleting an entity removes it, and what depended on it,
from the log.

A RabbitMQ node killed right after a declaration can come back with the queue
but without its binding (its bind-ok sent, its record not yet on disk); a message
published to the exchange then routes nowhere and is still confirmed.  So the
log belongs to the kombu ``Connection``, not to one transport connection: when
kombu's retry drops a connection and makes another, the new one declares it all
again on each broker it reaches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import amqp

if TYPE_CHECKING:
    from .brokers import BrokerLink

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Declaration:
    method: str
    kwargs: tuple[tuple[str, Any], ...]

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.kwargs)


def _key(method: str, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    if method == "exchange_declare":
        return (method, kwargs.get("exchange"))
    if method == "queue_declare":
        return (method, kwargs.get("queue"))
    return (method, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


class DeclarationLog:
    """Ordered, de-duplicated record of declarations and bindings."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], Declaration] = {}
        #: queues the brokers may hold as another type than declared here
        self._type_unknown: set[str] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Declaration]:
        return iter(list(self._entries.values()))

    def record(self, method: str, kwargs: dict[str, Any]) -> None:
        if kwargs.get("passive"):
            return
        replay = {k: v for k, v in kwargs.items() if k != "nowait"}
        key = _key(method, replay)
        if method == "queue_declare":
            self._type_unknown.discard(replay.get("queue", ""))
        self._entries.pop(key, None)  # keep the newest last, after what it depends on
        self._entries[key] = Declaration(method, tuple(replay.items()))

    def declared_classic(self, queue: str) -> bool:
        """Can this connection vouch that ``queue`` is a classic queue on every broker? Only
        if it declared it so, and no broker has since held it with other arguments or
        cancelled its consumer (``beetle queues migrate`` may have made it a quorum queue)."""
        decl = self._entries.get(("queue_declare", queue))
        if decl is None or queue in self._type_unknown:
            return False
        arguments = decl.args.get("arguments") or {}
        return str(arguments.get("x-queue-type", "classic")) == "classic"

    def type_unknown(self, queue: str) -> None:
        """A broker holds ``queue`` with other arguments than declared, or cancelled its
        consumer: its type is unknown until this connection declares it again."""
        self._type_unknown.add(queue)

    def forget(self, method: str, kwargs: dict[str, Any]) -> None:
        if method == "queue_delete":
            name = kwargs.get("queue")
            self._drop(lambda d: d.args.get("queue") == name)
        elif method == "exchange_delete":
            name = kwargs.get("exchange")
            self._drop(
                lambda d: (
                    d.args.get("exchange") == name
                    or (d.method in ("exchange_bind",) and d.args.get("source") == name)
                    or (d.method in ("exchange_bind",) and d.args.get("destination") == name)
                )
            )
        elif method in ("queue_unbind", "exchange_unbind"):
            bind = "queue_bind" if method == "queue_unbind" else "exchange_bind"
            target = {k: v for k, v in kwargs.items() if k != "nowait"}
            self._drop(
                lambda d: (
                    d.method == bind
                    and all(d.args.get(k) == v for k, v in target.items() if k != "arguments")
                )
            )

    def _drop(self, predicate: Callable[[Declaration], bool]) -> None:
        for key, decl in list(self._entries.items()):
            if predicate(decl):
                del self._entries[key]

    def replay(self, link: BrokerLink, queue: str | None = None) -> None:
        """Declare everything again on ``link`` through a short-lived channel (only ``queue``
        and its bindings when given)."""
        if not self._entries or link.conn is None:
            return
        conn = link.conn
        channel = conn.channel()
        try:
            for decl in self:
                if queue is not None and decl.args.get("queue") != queue:
                    continue
                try:
                    getattr(channel, decl.method)(**decl.args)
                except amqp.ChannelError as exc:
                    # one bad entity must not keep the broker out of the set; a queue that
                    # exists with other arguments (migrated) is consumed as it is
                    log = logger.warning if "inequivalent arg" in str(exc) else logger.error
                    log("beetle: cannot re-declare %s on %s: %r", decl, link.name, exc)
                    if decl.method == "queue_declare":
                        self.type_unknown(decl.args.get("queue", ""))
                    channel = conn.channel()
        finally:
            if channel.is_open:
                channel.close()


def declarations_of(client: Any) -> DeclarationLog:
    """The declaration log of a kombu ``Connection`` (a new one without a client)."""
    if client is None:
        return DeclarationLog()
    log = getattr(client, "_beetle_declarations", None)
    if not isinstance(log, DeclarationLog):
        log = DeclarationLog()
        client._beetle_declarations = log
    return log
