"""Trace events: the JSON-lines record both sides write and ``beetle audit`` reads.

The audit can only prove "nothing lost, nothing run twice" from evidence written at the moment
things happen, so the publisher and the worker append one line per event. Tracing is off by
default (:class:`NullTracer`); ``get_tracer(directory)`` turns it on.

Line format (one JSON object per line, keys in this order; absent values are ``null``)::

    {"ts_ms": 1763769600123, "event": "completed", "message_id": "…", "queue": "orders",
     "task_name": "shop.process_order", "task_id": "…", "broker": "rabbit-a:5672",
     "worker": "celery@host-3", "pid": 4123, "attempt": 1, "detail": {"runtime_ms": 812}}

``ts_ms``, ``event``, ``message_id`` and ``queue`` are required; the audit counts a line
without them as malformed. The ``queue`` field names the message's **dedup scope**
(:mod:`kombu_beetle.scopes`), not a physical queue: ``(queue, message_id)`` is the dedup
identity, one record and one run, so both sides must name the same scope. The publisher
writes the routing key (the queue name under Celery's direct routing) mapped through the
``dedup_scopes`` transport option; the worker writes the scope of the queue it consumed from
(``beetle_dedup_scopes``). Without a mapping both are the queue's name. So a message in the
old and the new queue of a migration is one message to the audit, and a message in two
queues of a fan-out (two scopes) is two.

Who emits what:

``published`` (transport, publishing process)
    Only for redundant messages (the audited ones: workers deduplicate and trace them to
    the end), and not for a worker moving a message on (``x-beetle-republished``).
    One event **per broker copy**, written once that copy's confirm is known, with ``broker``
    set and ``detail = {"confirmed": bool, "redundant": bool, "copies": n}`` where ``copies``
    is how many copies the publish meant to write. A redundant pair is therefore two
    ``published`` events with the same ``message_id`` and two brokers; the audit counts the
    message once and uses the two brokers for redundancy coverage. A redundant publish that
    found one live broker writes one event with ``"copies": 1, "redundant": true``.
``delivered`` / ``duplicate`` / ``deferred`` / ``expired`` (worker main process, the gate)
    ``delivered`` for every delivery of every copy (``broker`` = the delivering broker,
    ``detail.redelivered``); then at most one of ``duplicate`` (acked and dropped: already
    completed or failed), ``deferred`` (running or delayed elsewhere, ``detail.delay_s``) or
    ``expired`` (past ``x-beetle-expires-at``, acked, never run).
``started`` / ``completed`` / ``failed`` / ``retried`` / ``dead_lettered`` (pool process)
    ``started`` after a successful claim with ``attempt`` = the claim's attempt number;
    ``completed`` after the complete script stored the result (``detail.runtime_ms``);
    ``failed`` for every failed run (``detail.exc``); ``retried`` when that failure is
    scheduled again (``detail.delay_s``); ``dead_lettered`` when it gives up
    (``detail.reason``). ``failed``/``completed`` carry the same ``attempt`` as their
    ``started``, which is how the audit pairs them into runs.
``replayed`` (``beetle dead-letters replay``, role ``ops``)
    A dead letter published back to its queue, once the republish is confirmed
    (``detail = {"replay_id", "queue"}``): the audit counts a message that completes after
    its replay as replayed, not as unexpected or duplicated.

``enqueued`` (the application, role ``outbox``)
    A task written to the transactional outbox (:mod:`celery_beetle.outbox`), once its
    transaction committed; a rolled-back one writes nothing.
``relayed`` (the outbox relay, role ``publisher``)
    The outbox row was deleted after its publish was confirmed (``detail.attempts``), or
    set aside for an operator without being published (``detail.aside``: the reason). The
    audit calls an ``enqueued`` message without a ``published`` event ``never_relayed``.

Writing never blocks or fails a task: ``emit`` only appends to an in-memory buffer; a daemon
thread writes it out every ``flush_interval_s`` or when ``buffer_bytes`` is reached, and past
``max_buffer_bytes`` new events are dropped and counted. Outcome events (``sync_events``:
``completed``, ``dead_lettered``, ``expired`` by default) write the buffer through at once,
one ``write`` to the page cache: a worker killed with ``kill -9`` right after completing must
not leave a trace that reads "lost" (with ``defer_sync``, at the caller's next
:meth:`~TraceWriter.flush_owed`: the gate's, after each batch of Redis replies). Other
events of a killed process may be missing for up to ``flush_interval_s``; the audit
classifies by outcome events, so that costs latency samples, not verdicts, with one
exception: a ``published`` event of a worker that sends a message (a chain's next link)
is written as the sending task ends (:func:`flush_role`), before its delivery is acked.
Pool processes that exit through ``os._exit`` skip ``atexit``: the worker side should call
:func:`flush_all` on ``worker_process_shutdown``. Files roll by size and age. Disk errors are
counted in :attr:`TraceWriter.errors` and logged once, never raised. Each process writes its
own file, ``<host>-<pid>-<role>-<start>-<seq>.jsonl``, so forked pool children
never interleave writes with their parent; buffers are flushed at interpreter exit.

Events can hold task names and exception text, so trace files are private: each is created
mode 0600 (whatever the umask) and opened with ``O_NOFOLLOW``, so a symlink planted under
the file's name (the names are predictable) makes the open fail rather than write through
it. A directory the tracer creates is mode 0700; an existing one keeps its mode.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import urlparse

__all__ = [
    "EVENTS",
    "FIELDS",
    "NullTracer",
    "TraceWriter",
    "Tracer",
    "flush_all",
    "flush_role",
    "get_tracer",
]

logger = logging.getLogger(__name__)

FIELDS = (
    "ts_ms",
    "event",
    "message_id",
    "queue",
    "task_name",
    "task_id",
    "broker",
    "worker",
    "pid",
    "attempt",
    "detail",
)
EVENTS = (
    "published",
    "delivered",
    "duplicate",
    "deferred",
    "started",
    "completed",
    "failed",
    "retried",
    "dead_lettered",
    "expired",
    "replayed",
    "enqueued",
    "relayed",
)
_EVENT_SET = frozenset(EVENTS)

#: A line, its fields in :data:`FIELDS` order. Filling it with each value's JSON text is what
#: ``json.dumps(record, separators=(",", ":"), default=str)`` writes, at about 60 % of the
#: cost: a worker writes four or five events per task.
_LINE = (
    '{"ts_ms":%d,"event":"%s","message_id":%s,"queue":%s,"task_name":%s,"task_id":%s,'
    '"broker":%s,"worker":%s,"pid":%s,"attempt":%s,"detail":%s}\n'
)
_encode_str = json.encoder.encode_basestring_ascii  # the C encoder json.dumps uses
_encode_other = json.JSONEncoder(separators=(",", ":"), default=str).encode


def _json(value: Any) -> str:
    """``value`` as :func:`json.dumps` writes it in a line (strings and ints the quick way)."""
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if value is None:
        return "null"
    if kind is int:
        return int.__repr__(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is dict and all(type(k) is str for k in value):
        # a ``detail`` ({"redelivered": false}); the encoder's set-up costs more than this
        items = ",".join(f"{_encode_str(k)}:{_json(v)}" for k, v in value.items())
        return "{" + items + "}"
    return _encode_other(value)


class Tracer(Protocol):
    """What callers rely on; both :class:`TraceWriter` and :class:`NullTracer` provide it."""

    def emit(self, event: str, message_id: str, queue: str | None = None, **fields: Any) -> None:
        """Record one event; never raises."""

    def flush(self) -> None:
        """Write buffered events now."""

    def flush_owed(self) -> None:
        """Write buffered events if an outcome event waits (``defer_sync``)."""

    def close(self) -> None:
        """Flush and release the file."""


class NullTracer:
    """Tracing off: every call is a no-op, so call sites need no ``if tracing`` branches."""

    enabled = False

    def emit(self, event: str, message_id: str, queue: str | None = None, **fields: Any) -> None:
        return None

    def flush(self) -> None:
        return None

    def flush_owed(self) -> None:
        return None

    def close(self) -> None:
        return None


_writers: weakref.WeakSet[TraceWriter] = weakref.WeakSet()


class TraceWriter:
    """Buffered, rolling, per-process JSON-lines writer of trace events."""

    enabled = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        role: str = "worker",
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_age_s: float = 3600.0,
        flush_interval_s: float = 1.0,
        buffer_bytes: int = 256 * 1024,
        max_buffer_bytes: int = 16 * 1024 * 1024,
        sync_events: Iterable[str] = ("completed", "dead_lettered", "expired"),
        defer_sync: bool = False,
        worker: str | None = None,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.role = role
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.flush_interval_s = flush_interval_s
        self.buffer_bytes = buffer_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.sync_events = frozenset(sync_events)
        #: ``sync_events`` wait for :meth:`flush_owed` instead of writing through at once
        self.defer_sync = defer_sync
        self.host = (host or socket.gethostname()).replace(os.sep, "_")
        self.worker = worker
        self.clock = clock
        #: Events written to a file, events dropped (buffer full or write failed), I/O errors.
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self._closed = False
        self._start_process()
        _writers.add(self)

    def _start_process(self) -> None:
        """(Re)initialise per-process state; also run in a forked child on first use."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._buf: list[str] = []
        self._buf_size = 0
        self._file: IO[str] | None = None
        self._file_bytes = 0
        self._file_opened = 0.0
        self._seq = 0
        self._owed = False
        self._stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        self._logged = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- producing -------------------------------------------------------------------------

    def emit(self, event: str, message_id: str, queue: str | None = None, **fields: Any) -> None:
        """Record one event; never raises.

        ``fields`` are the optional line fields (``task_name``, ``task_id``, ``broker``,
        ``worker``, ``pid``, ``attempt``, ``detail``); other keywords are ignored. Ordinary
        events only go to the buffer; ``sync_events`` also write the buffer through.
        """
        try:
            if self._closed:
                return
            if os.getpid() != self._pid:
                self._start_process()  # forked: drop the parent's buffer, open our own file
            if event not in _EVENT_SET:
                self._error(ValueError(f"unknown trace event {event!r}; expected one of {EVENTS}"))
                return
            get = fields.get
            pid, worker = get("pid"), get("worker")
            line = _LINE % (
                int(self.clock() * 1000),
                event,  # one of EVENTS: needs no escaping
                _json(message_id),
                _json(queue),
                _json(get("task_name")),
                _json(get("task_id")),
                _json(get("broker")),
                _json(self.worker if worker is None else worker),
                _json(self._pid if pid is None else pid),
                _json(get("attempt")),
                _json(get("detail")),
            )
            with self._lock:
                if self._buf_size + len(line) > self.max_buffer_bytes:
                    self.dropped += 1
                    return
                self._buf.append(line)
                self._buf_size += len(line)
                due = self._buf_size >= self.buffer_bytes
            if event in self.sync_events:
                if not self.defer_sync:
                    self.flush()
                    return
                self._owed = True  # written by flush_owed, or by the thread at the latest
            if self._thread is None:
                self._start_thread()
            if due:
                self._wake.set()
        except Exception as exc:  # a trace must never fail the task that emits it
            self._error(exc)

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"beetle-trace-{self.role}", daemon=True
            )
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self.flush()

    # -- writing ---------------------------------------------------------------------------

    def flush_owed(self) -> None:
        """Write the buffer if it holds an outcome event (``defer_sync``): a caller that
        settles several messages at a time (the gate, per batch of Redis replies) writes
        once per batch, and not at all for a batch that settled nothing."""
        if self._owed:
            self.flush()

    def flush(self) -> None:
        """Write everything buffered so far to the current file (rolling it if due)."""
        if os.getpid() != self._pid:
            return
        self._owed = False
        with self._io_lock:
            with self._lock:
                lines, self._buf, self._buf_size = self._buf, [], 0
            if not lines:
                return
            try:
                f = self._current_file()
                data = "".join(lines)
                f.write(data)
                f.flush()
                self._file_bytes += len(data)
                self.written += len(lines)
            except Exception as exc:
                self.dropped += len(lines)
                self._close_file()
                self._error(exc)

    def _current_file(self) -> IO[str]:
        now = self.clock()
        if self._file is not None and (
            self._file_bytes >= self.max_bytes or now - self._file_opened >= self.max_age_s
        ):
            self._close_file()
            self._seq += 1
        if self._file is None:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._file = open_private(self.path)
            self._file_bytes = self._file.tell()
            self._file_opened = now
        return self._file

    @property
    def path(self) -> Path:
        """The file this process writes to now."""
        name = f"{self.host}-{self._pid}-{self.role}-{self._stamp}-{self._seq:03d}.jsonl"
        return self.directory / name

    def _close_file(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except Exception as exc:
                self._error(exc)

    def _error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self._logged:
            self._logged = True
            logger.warning(
                "beetle trace: cannot write events to %s (%s); tracing continues best-effort "
                "and drops what it cannot write. Check the directory exists, is writable and "
                "has space, or unset beetle_trace_dir.",
                self.directory,
                exc,
            )

    def close(self) -> None:
        """Flush, stop the flusher thread and close the file. Later emits are ignored."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._wake.set()
        with self._io_lock:
            self._close_file()

    def __repr__(self) -> str:
        return f"<TraceWriter {self.role} {self.directory} pid={self._pid}>"


#: how trace files are opened: append, create 0600, never through a symlink
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE = 0o600


def open_private(path: Path) -> IO[str]:
    """Open ``path`` for appending, readable by its owner only; a symlink raises OSError.

    The mode is set at creation, so the file is never readable by others, not even for
    the moment a ``chmod`` after ``open`` would leave.
    """
    fd = os.open(path, _OPEN_FLAGS, FILE_MODE)
    try:
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


_cache: dict[tuple[str, str, int], TraceWriter] = {}
_cache_lock = threading.Lock()


def _directory(target: str | os.PathLike[str]) -> str:
    text = os.fspath(target)
    if "://" not in text:
        return text
    url = urlparse(text)
    if url.scheme != "file":
        raise ValueError(
            f"beetle trace target {text!r}: only a directory or a file:// URL is supported "
            "(write traces locally and ship them to s3a:// or hdfs:// for the audit)"
        )
    return url.path


def get_tracer(
    target: str | os.PathLike[str] | None, role: str = "worker", **options: Any
) -> TraceWriter | NullTracer:
    """The writer for ``target`` in this process, created once per (target, role, pid).

    A falsy ``target`` means tracing is off and returns a :class:`NullTracer`. The pid in the
    key is what gives each forked pool process its own writer and file.
    """
    if not target:
        return NullTracer()
    key = (_directory(target), role, os.getpid())
    with _cache_lock:
        writer = _cache.get(key)
        if writer is None or writer._closed:
            writer = _cache[key] = TraceWriter(key[0], role, **options)
        return writer


def _after_fork_in_child() -> None:
    """A forked child inherits copies of its parent's writers and maybe a held lock.

    Reset them so the child neither writes the parent's buffered events a second time nor
    deadlocks on a lock some parent thread held at fork time.
    """
    global _cache_lock
    _cache_lock = threading.Lock()
    _cache.clear()
    for writer in list(_writers):
        if not writer._closed:
            writer._start_process()


def flush_all() -> None:
    """Write out every writer's buffer in this process (for shutdown signals)."""
    for writer in list(_writers):
        try:
            writer.flush()
        except Exception:
            pass


def flush_role(role: str) -> None:
    """Write out the buffers of this process's writers of ``role`` that hold events.

    A worker that publishes (a chain's next link, a task sent from a task) calls it for
    ``publisher`` as each task ends (``task_postrun``, before the delivery is acked): a
    ``published`` event lost with a killed worker would make the audit read the message it
    sent, which then runs, as "unexpected". Free when nothing was published."""
    for writer in list(_writers):
        if writer.role == role and writer._buf_size:
            try:
                writer.flush()
            except Exception:
                pass


def _flush_all_at_exit() -> None:
    for writer in list(_writers):
        try:
            writer.close()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_all_at_exit)
