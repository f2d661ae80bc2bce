"""The gate's Redis calls, pipelined on the worker's event loop instead of blocking it.

A synchronous call stops the worker's main process for a whole Redis round trip per
delivery: no frames are read, no results taken from the pool, no acks written meanwhile.
:class:`PipelinedReads` writes the calls the gate made in one loop pass (the ``HMGET`` of a
read, the ``EVALSHA`` of a claim or a completion) as one batch, and takes the replies when
the hub says the socket is readable; the gate goes on with each delivery from its reply's
callback. Replies come back in the order of the requests (one connection), so a FIFO of
callbacks matches them.

A script's error reply goes to that call's callback alone; a server that lost the script
(a restart, ``SCRIPT FLUSH``: ``NOSCRIPT``, nothing ran) gets it loaded again and the call
goes out in the next batch.

Faults end the same way as a failed synchronous read: every pending callback gets the
error, and the gate parks its delivery and pauses (see :mod:`celery_beetle.worker.gate`). A Redis
that stops answering without closing the socket (SIGSTOP, a partition) is caught by a
watchdog timer after ``timeout_s``.

A record whose key changed form in this release is read under its old key too (two HMGETs
in the same batch, two replies for one callback; the first record present counts: see
:mod:`celery_beetle.store.keys`).

Only for clients with one connection pool: plain Redis and a Sentinel-managed master
(where the pool asks the Sentinels for the master on every new connection). A Redis Cluster
client spreads keys over nodes, so the gate reads through it synchronously.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from celery_beetle.store.address import pooled_connection
from celery_beetle.store.redis import ScriptCall, decoded, first_record
from celery_beetle.store.state import FIELDS, MessageFacts, State

__all__ = ["PipelinedReads", "ReadCallback", "pipelined_reads_for"]

logger = logging.getLogger(__name__)

#: ``callback(state, None)`` with the record (None if absent), or ``callback(None, error)``.
ReadCallback = Callable[[State | None, BaseException | None], None]
#: ``callback(decision, None)`` with the script's parsed reply, or ``callback(None, error)``.
CallCallback = Callable[[Any, BaseException | None], None]


class _Request:
    """One call in a batch: its commands, how their replies make one answer, and who waits."""

    __slots__ = ("callback", "combine", "commands", "script")

    def __init__(
        self,
        commands: list[tuple[Any, ...]],
        combine: Callable[[list[Any]], Any],
        callback: Callable[[Any, BaseException | None], None],
        script: ScriptCall | None = None,
    ) -> None:
        self.commands = commands
        self.combine = combine
        self.callback = callback
        self.script = script


class PipelinedReads:
    """Gate reads on the hub: ``read(facts, callback)`` now, ``callback`` once Redis answers.

    - ``store``: the gate's :class:`~celery_beetle.store.redis.RedisStore` (its client's pool gives
      the connection; its ``round_trips`` counts one per batch written).
    - ``hub``: the worker's event loop (``call_soon``, ``call_later``, ``add_reader``,
      ``remove_reader``).
    """

    def __init__(self, store: Any, hub: Any, timeout_s: float = 2.0) -> None:
        self.store = store
        self.hub = hub
        self.timeout_s = timeout_s
        self._connection: Any = None
        self._fd: int | None = None
        self._queued: list[_Request] = []
        #: (sent at, request), in the order of the requests
        self._pending: deque[tuple[float, _Request]] = deque()
        self._flush_scheduled = False
        self._watchdog: Any = None
        #: requests answered and the seconds they waited, in all (read by the metrics)
        self.answered = 0
        self.waited_s = 0.0
        #: called after each batch of replies was handled (the gate writes its trace events)
        self.after_batch: Callable[[], None] = lambda: None
        #: True while a batch's replies are being handled (``after_batch`` follows)
        self.in_batch = False

    def read(self, facts: MessageFacts, callback: ReadCallback) -> None:
        """Ask for the record of ``facts``; the batch goes out at the end of this loop pass."""
        keys = self.store.record_keys(facts.scope, facts.message_id)
        commands = [("HMGET", key, *FIELDS) for key in keys]
        self._queue(_Request(commands, first_record, callback))

    def call(self, call: ScriptCall, callback: CallCallback) -> None:
        """Run a script (a claim, a completion: see ``RedisStore.*_call``) in the next batch;
        ``callback`` gets its parsed reply."""
        self._queue(
            _Request(
                [call.command()], lambda replies: call.parse(decoded(replies[0])), callback, call
            )
        )

    def claim(
        self,
        facts: MessageFacts,
        limits: Any,
        owner: str,
        callback: CallCallback,
        reserve_ms: int = 0,
    ) -> None:
        """The claim of ``facts`` for ``owner`` (a reservation of ``reserve_ms``, if given);
        ``callback`` gets a ``ClaimDecision``."""
        self.call(self.store.claim_call(facts, limits, owner, reserve_ms), callback)

    def renew(
        self, facts: MessageFacts, token: int, reserve_ms: int, callback: CallCallback
    ) -> None:
        """Renew the reservation ``token`` (a no-op once its body began); ``callback`` gets a
        ``FenceDecision``."""
        self.call(self.store.extend_call(facts, token, reserve_ms, reservation=True), callback)

    def complete(self, facts: MessageFacts, token: int, callback: CallCallback) -> None:
        """The completion of ``facts`` under ``token``; ``callback`` gets a ``FenceDecision``."""
        self.call(self.store.complete_call(facts, token), callback)

    def _queue(self, request: _Request) -> None:
        self._queued.append(request)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.hub.call_soon(self._flush)

    def write_now(self) -> None:
        """Write the calls queued so far now, not at the next loop pass. For callers on the
        hub's tick: it runs just before the loop waits for events, so a batch queued there
        would wait for the next event, whatever it is, before it went out."""
        if self._queued:
            self._flush()

    @property
    def pending(self) -> int:
        return len(self._queued) + len(self._pending)

    def close(self) -> None:
        """Drop the connection; pending callbacks get a ConnectionError."""
        self._fail(redis.exceptions.ConnectionError("the gate's reads were closed"))

    # -- writing ---------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        if not queued:
            return
        try:
            connection = self._connect()
            commands = [command for request in queued for command in request.commands]
            connection.send_packed_command(connection.pack_commands(commands), check_health=False)
        except Exception as exc:
            self._fail(exc, [request.callback for request in queued])
            return
        self.store.round_trips += 1
        sent_at = time.monotonic()
        self._pending.extend((sent_at, request) for request in queued)
        if self._watchdog is None:
            self._watchdog = self.hub.call_later(self.timeout_s, self._check_overdue)

    def _connect(self) -> Any:
        if self._connection is None:
            connection = pooled_connection(self.store.client.connection_pool)
            try:
                connection.connect()
                fd = connection._sock.fileno()
            except BaseException:
                self.store.client.connection_pool.release(connection)
                raise
            self._connection, self._fd = connection, fd
            self.hub.add_reader(fd, self._on_readable)
        return self._connection

    # -- reading ---------------------------------------------------------------------------

    def _on_readable(self, *args: Any) -> None:
        connection = self._connection
        if connection is None:
            return
        self.in_batch = True
        try:
            while self._pending:
                sent_at, request = self._pending[0]
                values, error = self._replies(connection, len(request.commands))
                self._pending.popleft()
                self.answered += 1
                self.waited_s += time.monotonic() - sent_at
                self._answered(request, values, error)
                if not connection.can_read(timeout=0):
                    break
            else:  # a reply nobody asked for: the stream is out of step
                if connection.can_read(timeout=0):
                    raise redis.exceptions.ConnectionError("unexpected reply on the gate's reads")
        except Exception as exc:
            self._fail(exc)
        finally:
            self.in_batch = False
            self.after_batch()

    @staticmethod
    def _replies(connection: Any, count: int) -> tuple[list[Any], BaseException | None]:
        """Read ``count`` replies; an error reply (the stream stays in step) is returned,
        a broken connection raises."""
        values, error = [], None
        for _ in range(count):
            try:
                values.append(connection.read_response())
            except redis.exceptions.ResponseError as exc:
                values.append(None)
                error = error or exc
        return values, error

    def _answered(self, request: _Request, values: list[Any], error: BaseException | None) -> None:
        if isinstance(error, redis.exceptions.NoScriptError) and request.script is not None:
            try:  # nothing ran: load the script (a sync round trip, after a restart) and resend
                self.store.client.script_load(request.script.script.script)
            except Exception as exc:
                self._answer(request.callback, None, exc)
                return
            self._queue(request)
            return
        if error is not None:
            self._answer(request.callback, None, error)
            return
        try:
            answer = request.combine(values)
        except Exception as exc:
            self._answer(request.callback, None, exc)
            return
        self._answer(request.callback, answer, None)

    def _check_overdue(self) -> None:
        self._watchdog = None
        if not self._pending:
            return
        waited = time.monotonic() - self._pending[0][0]
        if waited >= self.timeout_s:
            self._fail(redis.exceptions.TimeoutError(f"no reply from Redis in {waited:.1f} s"))
            return
        self._watchdog = self.hub.call_later(self.timeout_s - waited, self._check_overdue)

    # -- faults ----------------------------------------------------------------------------

    def _fail(self, exc: BaseException, extra: list[ReadCallback] | None = None) -> None:
        """Close the connection and hand ``exc`` to every pending callback."""
        self._disconnect()
        callbacks = [request.callback for _, request in self._pending] + (extra or [])
        self._pending.clear()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for callback in callbacks:
            self._answer(callback, None, exc)

    def _disconnect(self) -> None:
        connection, fd = self._connection, self._fd
        self._connection, self._fd = None, None
        if fd is not None:
            try:
                self.hub.remove_reader(fd)
            except Exception:  # the hub may be closing too
                pass
        if connection is not None:
            try:
                connection.disconnect()
            finally:
                self.store.client.connection_pool.release(connection)

    @staticmethod
    def _answer(
        callback: Callable[[Any, BaseException | None], None],
        answer: Any,
        exc: BaseException | None,
    ) -> None:
        try:
            callback(answer, exc)
        except Exception:  # one delivery's bug must not strand the others' replies
            logger.exception("beetle: the gate failed on a read's reply")


def pipelined_reads_for(store: Any, hub: Any, timeout_s: float) -> PipelinedReads | None:
    """Pipelined reads for ``store`` on ``hub``; None where the gate must read synchronously
    (no event loop: the solo pool without one, tests; a Redis Cluster client)."""
    if hub is None:
        return None
    client = getattr(store, "client", None)
    if not isinstance(client, redis.Redis):
        return None
    return PipelinedReads(store, hub, timeout_s)
