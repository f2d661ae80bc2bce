"""The relay: from ``beetle_outbox`` to two brokers, each committed task exactly once.

One pass (:meth:`Relay.relay_once`), in one database transaction:

1. claim up to ``batch_size`` due rows, oldest first, with ``SELECT … FOR UPDATE SKIP
   LOCKED``: relays side by side take disjoint rows and never wait on each other;
2. set aside (into ``beetle_outbox_aside``, with the reason) every row that must not be
   published: past its ``expires_at`` (the dedup window: after a restore from backup it may
   have run already, and the store no longer remembers), a payload the broker cannot carry,
   a queue or exchange that cannot be declared. A bad row never blocks the rows behind it;
3. publish the rest through the ``beetle://`` transport with every copy in flight at once
   (:meth:`~kombu_beetle.publish.Publisher.publish_many`), and flush the ``published``
   trace events to disk;
4. delete each row whose publish was confirmed (by two brokers, or by the one broker left
   when only one is up, flagged degraded as any publish is), count an attempt on the rest,
   and commit.

The relay can die anywhere. Before the commit, the row locks go with the connection and the
rows are still there: another pass publishes them again under the same message id, and the
dedup store drops the second copy. After the commit the rows are gone. So each committed
task runs once, as long as the store remembers the first publish (``expires_at``, fixed at
enqueue, is how long that is); a row past it is set aside for an operator, never published
blind. A rolled-back transaction left no row, so its task never runs.

Ordering keys: rows enqueued with one ``ordering_key`` are published one after another,
each after the one before it was confirmed, in the order of their ids (:func:`claim_keyed`).
*Order* is id order among the rows a pass can see, which is not always commit order: ids
are made at enqueue, so of two transactions enqueueing for one key at once, the one with the
later id may commit first and be published before the other commits. What holds is that a
committed row is never overtaken by a row of its key with a later id, and that a row of a
key set aside stops the key until an operator retries or drops it (other keys go on). To
make commit order and id order one, serialize the writers of a key in the application
(e.g. ``SELECT … FOR UPDATE`` on the key's business row before enqueueing): then a later
enqueue starts after the earlier commit.

Polling is adaptive: a full batch is followed by the next at once, an empty pass doubles the
wait from ``min_interval_s`` up to ``max_interval_s``. LISTEN/NOTIFY wake-ups are opt-in
(``listen=True`` and ``beetle_outbox_notify``; :mod:`.notify` says what they cost).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import amqp
import sqlalchemy as sa
from amqp.exceptions import ChannelError
from sqlalchemy.dialects import postgresql

from celery_beetle.outbox.enqueue import queue_from_spec
from celery_beetle.outbox.table import ASIDE, OUTBOX
from kombu_beetle.envelope import InvalidExpiry
from kombu_beetle.errors import MessageTooLarge, NoBrokerAvailable, UnencodableMessage
from kombu_beetle.publish import Outgoing

__all__ = [
    "Relay",
    "RelayPass",
    "claim_keyed",
    "drop_aside",
    "held_back",
    "move_aside",
    "retry_aside",
]

logger = logging.getLogger(__name__)

#: errors of a row, not of the brokers: the row is set aside
_ROW_ERRORS = (MessageTooLarge, InvalidExpiry)
#: how long a declared queue or a checked exchange is trusted without declaring it again
DECLARE_TTL_S = 60.0


@dataclass
class RelayPass:
    """What one pass did (the ids, for tests and the ``relayed`` trace)."""

    claimed: int = 0
    relayed: list[str] = field(default_factory=list)
    degraded: int = 0
    aside: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class Relay:
    """Relays due outbox rows of ``engine``'s database through ``channel``, a channel of a
    ``beetle://`` kombu connection that nothing else publishes on.

    ``tracer``: where ``relayed`` events go (default: the transport's publisher tracer).
    """

    def __init__(
        self,
        engine: sa.Engine,
        channel: Any,
        *,
        batch_size: int = 500,
        min_interval_s: float = 0.01,
        max_interval_s: float = 0.5,
        confirm_timeout_s: float | None = None,
        per_key: int = 100,
        inbox_sweep_s: float = 60.0,
        listen: bool = False,
        tracer: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.engine = engine
        self.channel = channel
        self.batch_size = batch_size
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self.confirm_timeout_s = confirm_timeout_s
        #: most rows of one ordering key per pass (each costs a confirm round trip)
        self.per_key = per_key
        #: how often the loop deletes expired inbox rows (when ``beetle_inbox`` exists)
        self.inbox_sweep_s = inbox_sweep_s
        self._next_sweep = 0.0
        #: LISTEN for enqueues' NOTIFY between passes (``celery_beetle.outbox.notify``), else sleep
        self.listener: Any = None
        if listen:
            from celery_beetle.outbox.notify import Listener

            self.listener = Listener(engine)
        self.tracer = tracer if tracer is not None else channel.connection.tracer
        self.clock = clock
        self._declared: dict[str, float] = {}
        #: the declarations of the row before, and until when they hold: rows of one queue
        #: come in runs, and comparing is cheaper than making the keys of ``_declared``
        self._last_declared: tuple[float, Any, str] = (0.0, None, "")
        #: totals since start: rows claimed, relayed (degraded among them), set aside, failed
        self.counts = dict.fromkeys(("claimed", "relayed", "degraded", "aside", "failed"), 0)

    # -- one pass ------------------------------------------------------------------------

    def relay_once(self) -> RelayPass:
        """Claim, publish, delete one batch (see the module docstring)."""
        result = RelayPass()
        now = dt.datetime.fromtimestamp(self.clock(), dt.timezone.utc)
        with self.engine.begin() as conn:
            claim = (
                sa.select(OUTBOX)
                .where(OUTBOX.c.scheduled_at <= now, OUTBOX.c.ordering_key.is_(None))
                .order_by(OUTBOX.c.scheduled_at, OUTBOX.c.id)
                .limit(self.batch_size)
                .with_for_update(skip_locked=True)
            )
            rows = [dict(row) for row in conn.execute(claim).mappings()]
            sequences = claim_keyed(conn, now, self.batch_size, self.per_key)
            result.claimed = len(rows) + sum(len(seq) for seq in sequences)
            if not result.claimed:
                return result
            # wave 0: the unordered rows and the head of each key; then each key's next row
            # once the one before it was confirmed (a key stops at its first row not relayed)
            self._send(rows + [seq[0] for seq in sequences], now, result)
            for position in range(1, max((len(seq) for seq in sequences), default=0)):
                relayed = set(result.relayed)
                wave = [seq[position] for seq in sequences if len(seq) > position
                        and seq[position - 1]["id"] in relayed]  # fmt: skip
                if not wave:
                    break
                self._send(wave, now, result)
            rows += [row for seq in sequences for row in seq]
            # the ``published`` events reach the disk before their rows are gone: a relay
            # killed after the commit must not leave a completion nobody published
            _flush_traces()
            if result.relayed:
                conn.execute(sa.delete(OUTBOX).where(_with_ids(conn, result.relayed)))
            if result.aside:
                move_aside(conn, result.aside, now)
            if result.failed:
                conn.execute(
                    sa.update(OUTBOX)
                    .where(_with_ids(conn, list(result.failed)))
                    .values(
                        attempts=OUTBOX.c.attempts + 1,
                        last_error=next(iter(result.failed.values())),
                    )
                )
        self._trace(rows, result)
        self._add(result)
        return result

    def _send(self, rows: list[dict[str, Any]], now: dt.datetime, result: RelayPass) -> None:
        """Set aside what must not go, publish the rest (all in flight at once), and note
        each row's outcome in ``result``."""
        sendable: list[tuple[dict[str, Any], Outgoing]] = []
        for row in rows:
            reason = self._reason_to_set_aside(row, now)
            if reason is None:
                try:
                    sendable.append((row, _outgoing(row)))
                    continue
                except (TypeError, ValueError, KeyError) as exc:
                    reason = f"bad payload: {type(exc).__name__}: {exc}"
            result.aside[row["id"]] = reason
        if not sendable:
            return
        publisher = self.channel.publisher
        outcomes = publisher.publish_many([o for _, o in sendable], self.confirm_timeout_s)
        for (row, _), outcome in zip(sendable, outcomes, strict=True):
            if outcome.ok:
                result.relayed.append(row["id"])
                result.degraded += outcome.degraded
            elif isinstance(outcome.error, UnencodableMessage):
                result.aside[row["id"]] = f"bad payload: {outcome.error}"
            elif isinstance(outcome.error, _ROW_ERRORS):
                result.aside[row["id"]] = f"{type(outcome.error).__name__}: {outcome.error}"
            else:
                result.failed[row["id"]] = f"{type(outcome.error).__name__}: {outcome.error}"

    def _reason_to_set_aside(self, row: Mapping[str, Any], now: dt.datetime) -> str | None:
        if row["expires_at"] <= now:
            return (
                f"past the dedup window (expired {row['expires_at'].isoformat()}): it may have "
                "run already (a restore from backup?) and the dedup store no longer remembers "
                "it; check, then `beetle outbox retry` to run it anyway"
            )
        try:
            self._declare(row)
        except ChannelError as exc:
            return f"cannot declare its queue or exchange: {exc}"
        return None

    def _declare(self, row: Mapping[str, Any]) -> None:
        """Declare the row's queues as Celery's producer would (once a minute per queue);
        with none, check its exchange exists: a publish to a missing exchange would close
        the channel and fail every other publish in flight on it."""
        declare, exchange = row["declare"], row["exchange"]
        now = time.monotonic()
        until, last_declare, last_exchange = self._last_declared
        if until > now and declare == last_declare and exchange == last_exchange:
            return
        specs = list(declare or ())
        if not specs and exchange:
            specs = [{"check_exchange": exchange}]
        until = now + DECLARE_TTL_S
        for spec in specs:
            key = json.dumps(spec, sort_keys=True)
            if self._declared.get(key, 0.0) <= now:
                if "check_exchange" in spec:
                    self.channel.exchange_declare(spec["check_exchange"], passive=True)
                else:
                    queue_from_spec(spec)(self.channel).declare()
                self._declared[key] = now + DECLARE_TTL_S
            until = min(until, self._declared[key])
        self._last_declared = (until, declare, exchange)

    def _trace(self, rows: Iterable[Mapping[str, Any]], result: RelayPass) -> None:
        if not getattr(self.tracer, "enabled", False):
            return
        by_id = {row["id"]: row for row in rows}
        scopes = getattr(getattr(self.channel.connection, "options", None), "dedup_scopes", {})
        for message_id in result.relayed:
            row = by_id[message_id]
            self.tracer.emit(
                "relayed",
                message_id,
                queue=scopes.get(row["routing_key"], row["routing_key"]),
                task_name=row["task_name"],
                detail={"attempts": row["attempts"] + 1},
            )
        for message_id, reason in result.aside.items():
            row = by_id[message_id]
            self.tracer.emit(
                "relayed",
                message_id,
                queue=scopes.get(row["routing_key"], row["routing_key"]),
                task_name=row["task_name"],
                detail={"aside": reason},
            )
        self.tracer.flush()

    def _add(self, result: RelayPass) -> None:
        counts = self.counts
        counts["claimed"] += result.claimed
        counts["relayed"] += len(result.relayed)
        counts["degraded"] += result.degraded
        counts["aside"] += len(result.aside)
        counts["failed"] += len(result.failed)

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, *, max_passes: int | None = None) -> None:
        """Relay until ``stop`` is set: at once after a full batch, waiting longer after
        each empty one. A database or broker error is logged and retried with the same
        backoff; the rows stay until a pass commits."""
        stop = stop or threading.Event()
        wait = self.min_interval_s
        passes = 0
        while not stop.is_set() and (max_passes is None or passes < max_passes):
            passes += 1
            self._sweep_inbox()
            try:
                result = self.relay_once()
            except (sa.exc.OperationalError, sa.exc.InterfaceError, NoBrokerAvailable,
                    ConnectionError, OSError) as exc:  # fmt: skip
                logger.warning("beetle relay: pass failed, retrying in %.2fs: %s", wait, exc)
                stop.wait(wait)  # not woken by a commit: the trouble may be the database
                wait = min(wait * 2, self.max_interval_s)
                continue
            if result.claimed >= self.batch_size:
                wait = self.min_interval_s
                continue
            if result.claimed and not result.failed:
                wait = self.min_interval_s
            else:
                wait = min(max(wait, self.min_interval_s) * 2, self.max_interval_s)
            if self.listener is not None and self.listener.wait(wait, stop):
                wait = self.min_interval_s  # a commit woke us: the next pass has rows
            elif self.listener is None:
                stop.wait(wait)
        if self.listener is not None:
            self.listener.close()

    def _sweep_inbox(self) -> None:
        """Expired inbox rows go, now and then, in small batches (a relay is the one
        long-running process every outbox user has)."""
        if time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + self.inbox_sweep_s
        from celery_beetle.outbox.inbox import sweep
        from celery_beetle.outbox.table import INBOX

        try:
            if sa.inspect(self.engine).has_table(INBOX.name):
                sweep(self.engine)
        except sa.exc.SQLAlchemyError as exc:
            logger.warning("beetle relay: inbox sweep failed (next in %.0fs): %s",
                           self.inbox_sweep_s, exc)  # fmt: skip


def claim_keyed(
    conn: sa.Connection, now: dt.datetime, limit: int, per_key: int
) -> list[list[dict[str, Any]]]:
    """Lock the keys this pass may relay and return their due rows, one list per key in
    id order (at most ``limit`` rows in all, ``per_key`` of one key).

    A key belongs to whoever locks its *head*, its row with the lowest id: ``SKIP LOCKED``
    on the heads means another relay's key is skipped whole, so two relays never publish
    rows of one key side by side. A key with a row set aside has no head here: its later
    rows wait for an operator (``beetle outbox retry`` / ``drop``). A key's rows after its
    first row not yet due wait for it too.
    """
    blocked = sa.exists().where(ASIDE.c.ordering_key == OUTBOX.c.ordering_key)
    earlier = OUTBOX.alias("earlier")
    has_earlier = sa.exists().where(
        earlier.c.ordering_key == OUTBOX.c.ordering_key, earlier.c.id < OUTBOX.c.id
    )
    heads = (
        sa.select(OUTBOX.c.ordering_key)
        .where(
            OUTBOX.c.ordering_key.is_not(None),
            OUTBOX.c.scheduled_at <= now,
            ~has_earlier,
            ~blocked,
        )
        .order_by(OUTBOX.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    keys = list(conn.execute(heads).scalars())
    if not keys:
        return []
    # not locked: no other relay takes a row of these keys while we hold their heads
    ranked = (
        sa.select(
            OUTBOX,
            sa.func.row_number()
            .over(partition_by=OUTBOX.c.ordering_key, order_by=OUTBOX.c.id)
            .label("position"),
        )
        .where(OUTBOX.c.ordering_key.in_(keys))
        .subquery()
    )
    rows = conn.execute(
        sa.select(*[ranked.c[c.name] for c in OUTBOX.columns])
        .where(ranked.c.position <= per_key)
        .order_by(ranked.c.ordering_key, ranked.c.id)
    ).mappings()
    by_key: dict[str, list[dict[str, Any]]] = {}
    stopped: set[str] = set()
    for row in rows:
        key = row["ordering_key"]
        if key in stopped or row["scheduled_at"] > now:
            stopped.add(key)
            continue
        by_key.setdefault(key, []).append(dict(row))
    sequences, taken = [], 0
    for key in keys:  # oldest head first
        seq = by_key.get(key, [])[: max(0, limit - taken)]
        if seq:
            sequences.append(seq)
            taken += len(seq)
    return sequences


def _outgoing(row: Mapping[str, Any]) -> Outgoing:
    """The AMQP message of a row. Whether its properties and headers serialize is found
    by ``publish_many``, which serializes them once for every copy and returns
    :class:`~kombu_beetle.errors.UnencodableMessage` for a row it cannot send."""
    properties = dict(row["properties"] or {})
    headers = dict(row["headers"] or {})
    body = row["body"]
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"body is {type(body).__name__}, not bytes")
    message = amqp.Message(bytes(body), application_headers=headers, **properties)
    if not row["routing_key"] and not row["exchange"]:
        raise ValueError("no exchange and no routing key: the message would go nowhere")
    return Outgoing(message, row["exchange"] or "", row["routing_key"] or "")


def _with_ids(conn: sa.Connection, ids: list[str]) -> sa.ColumnElement[bool]:
    """The outbox rows of ``ids``: on PostgreSQL ``id = ANY(:ids)``, one array parameter and
    one statement whatever the count (an ``IN`` list has a parameter per id to render,
    send and parse, and a statement text per count); ``IN`` elsewhere."""
    if conn.dialect.name == "postgresql":
        return OUTBOX.c.id == sa.any_(sa.bindparam("ids", ids, type_=_UUIDS))
    return OUTBOX.c.id.in_(ids)


_UUIDS = postgresql.ARRAY(sa.Uuid(as_uuid=False))


def _flush_traces() -> None:
    from kombu_beetle.trace import flush_all

    flush_all()


def move_aside(conn: sa.Connection, reasons: Mapping[str, str], now: dt.datetime) -> None:
    """Move rows from ``beetle_outbox`` to ``beetle_outbox_aside`` with their reasons."""
    columns = [c.name for c in OUTBOX.columns if c.name != "last_error"]
    rows = (
        conn.execute(
            sa.select(*[OUTBOX.c[name] for name in columns]).where(OUTBOX.c.id.in_(list(reasons)))
        )
        .mappings()
        .all()
    )
    if rows:
        conn.execute(
            sa.insert(ASIDE),
            [{**row, "reason": reasons[row["id"]], "moved_at": now} for row in rows],
        )
        conn.execute(sa.delete(OUTBOX).where(OUTBOX.c.id.in_(list(reasons))))
        for row in rows:
            logger.warning("beetle relay: set aside %s (%s): %s", row["id"], row["task_name"],
                           reasons[row["id"]])  # fmt: skip


def drop_aside(engine: sa.Engine, ids: Iterable[str]) -> list[str]:
    """Delete set-aside rows for good (an operator decided they must not run): the later
    rows of their ordering keys go on. Returns the ids deleted."""
    ids = list(ids)
    if not ids:
        return []
    with engine.begin() as conn:
        gone = conn.execute(sa.delete(ASIDE).where(ASIDE.c.id.in_(ids)).returning(ASIDE.c.id))
        return [row.id for row in gone]


def held_back(conn: sa.Connection, keys: Iterable[str]) -> dict[str, int]:
    """How many outbox rows of each ordering key wait behind a row set aside."""
    keys = [k for k in keys if k]
    if not keys:
        return {}
    counts = conn.execute(
        sa.select(OUTBOX.c.ordering_key, sa.func.count())
        .where(OUTBOX.c.ordering_key.in_(keys))
        .group_by(OUTBOX.c.ordering_key)
    )
    return {key: int(n) for key, n in counts}


def retry_aside(
    engine: sa.Engine,
    ids: Iterable[str] = (),
    *,
    everything: bool = False,
    message_ttl_s: float = 86_400.0,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """Move set-aside rows back into the outbox, due now, with a fresh ``expires_at``
    (an operator decided they must run); returns the ids moved."""
    from kombu_beetle.envelope import EXPIRES_AT_HEADER

    ids = list(ids)
    if not ids and not everything:
        raise ValueError("name the rows to retry, or ask for all of them")
    now = dt.datetime.fromtimestamp(clock(), dt.timezone.utc)
    expires = now + dt.timedelta(seconds=message_ttl_s)
    with engine.begin() as conn:
        query = sa.select(ASIDE).with_for_update(skip_locked=True)
        if not everything:
            query = query.where(ASIDE.c.id.in_(ids))
        rows = conn.execute(query).mappings().all()
        if not rows:
            return []
        columns = [c.name for c in OUTBOX.columns if c.name != "last_error"]
        fresh = []
        for row in rows:
            values = {name: row[name] for name in columns}
            values["headers"] = {**row["headers"], EXPIRES_AT_HEADER: int(expires.timestamp())}
            values.update(scheduled_at=now, expires_at=expires, attempts=0)
            fresh.append(values)
        conn.execute(sa.insert(OUTBOX), fresh)
        moved = [row["id"] for row in rows]
        conn.execute(sa.delete(ASIDE).where(ASIDE.c.id.in_(moved)))
    return moved
