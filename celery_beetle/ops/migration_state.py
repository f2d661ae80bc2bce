"""Where a live queue migration stands, kept in the dedup store (Redis), and the lease that
lets one process at a time carry it on. See :mod:`celery_beetle.ops.migrate` for the steps.

Keys (``<prefix>`` is the workers' ``beetle_key_prefix``)::

    <prefix>ops:migration:<vhost>:<queue>        the state, JSON, saved after every step
    <prefix>ops:migration:<vhost>:<queue>:lock   the lease of the process carrying it on

**The lease is a fence.** A process can lose it without knowing: paused (SIGSTOP, a VM
frozen, a long GC) or cut off from Redis for longer than its TTL, while a ``--resume``
elsewhere takes the lease over and carries the migration on. Waking, the first one must not
delete a queue the other rebuilt, nor save its stale state over the other's. So:

* every state save compares the lease's token in the same Lua script that writes the state
  (:meth:`StateStore.save` with the lock): atomic, a stale process never writes;
* before every step that deletes, declares or moves on a broker, the migrator calls
  :meth:`MigrationLock.check`, one Lua script that compares the token and extends the lease
  to its full TTL. A process that lost the lease stops there with :class:`LeaseLost`.

RabbitMQ cannot compare a token, so the broker steps keep a window: a process paused after
its check and before the step's one AMQP call (a delete, a declare) makes that one call
when it wakes, however late. Each such step is one round trip, and a move re-checks every
:data:`MOVE_FENCE_EVERY` messages; moves never lose a message (acked once confirmed, an
unroutable copy keeps its original) and a queue is deleted only if empty (classic) or
after its emptiness was checked. A stale process that wakes makes at most one such call
and stops at its next check.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kombu_beetle.scopes import migrating_queue

__all__ = [
    "BROKER_STEPS",
    "PHASES",
    "LeaseLost",
    "MigrationError",
    "MigrationLock",
    "MigrationState",
    "StateStore",
]

#: a broker's steps, in order; the step named is the next thing to do
BROKER_STEPS = ("pending", "drained", "recreated", "moved-back")
PHASES = ("planned", "temp-consumed", "temp-released", "done")


#: a move checks the lease again after this many messages
MOVE_FENCE_EVERY = 200

#: KEYS[1] the lease, ARGV[1] our token, ARGV[2] TTL in ms. Returns 1 (ours, extended) or 0.
_CHECK_LUA = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('pexpire', KEYS[1], ARGV[2])
return 1
"""
#: KEYS[1] the lease, KEYS[2] the state; ARGV[1] our token, ARGV[2] the state's JSON.
#: Returns 1 (saved) or 0 (the lease is not ours: nothing written).
_SAVE_LUA = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('set', KEYS[2], ARGV[2])
return 1
"""


class MigrationError(RuntimeError):
    """The migration cannot start or go on; the message says why and what to do."""


class LeaseLost(MigrationError):
    """This process no longer holds the migration's lease: another one carries it on."""


@dataclass
class MigrationState:
    """Where a migration stands: saved after every step."""

    queue: str
    vhost: str
    arguments: dict[str, Any]
    brokers: list[str]
    phase: str = "planned"
    steps: dict[str, str] = field(default_factory=dict)
    #: per broker: the queue's bindings from named exchanges, saved before it is deleted
    bindings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: per broker: messages moved (out, back)
    moved: dict[str, list[int]] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    workers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for broker in self.brokers:
            self.steps.setdefault(broker, "pending")
            self.moved.setdefault(broker, [0, 0])

    @property
    def temp(self) -> str:
        return migrating_queue(self.queue)

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def describe(self) -> str:
        """What ``--status`` prints."""
        lines = [
            f"migration of {self.queue!r} (vhost {self.vhost!r}) to "
            f"{json.dumps(self.arguments, sort_keys=True)}: {self.phase}",
            f"  started {_when(self.started_at)}, last step {_when(self.updated_at)}",
        ]
        for broker in self.brokers:
            out, back = self.moved.get(broker, [0, 0])
            lines.append(f"  {broker}: {self.steps[broker]} (moved {out} out, {back} back)")
        if self.workers:
            lines.append(f"  workers consuming {self.temp}: {', '.join(self.workers)}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> MigrationState:
        return cls(**json.loads(text))


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


class StateStore:
    """Migration states in Redis, one key per (vhost, queue)."""

    def __init__(self, client: Any, prefix: str = "beetle:") -> None:
        self.client = client
        self.prefix = prefix

    def key(self, vhost: str, queue: str) -> str:
        return f"{self.prefix}ops:migration:{vhost}:{queue}"

    def load(self, vhost: str, queue: str) -> MigrationState | None:
        text = self.client.get(self.key(vhost, queue))
        return MigrationState.from_json(text) if text else None

    def save(self, state: MigrationState, lock: MigrationLock | None = None) -> None:
        """Save ``state``; with ``lock``, only while that lock holds the lease (one Lua
        script: compare, then write), else :class:`LeaseLost` and nothing written."""
        state.updated_at = time.time()
        key = self.key(state.vhost, state.queue)
        if lock is None:
            self.client.set(key, state.to_json())
            return
        if not self.client.eval(_SAVE_LUA, 2, lock.key, key, lock.owner, state.to_json()):
            raise lock.lost(f"saving the step {state.phase!r}")

    def delete(self, vhost: str, queue: str) -> None:
        self.client.delete(self.key(vhost, queue))

    def lock(self, vhost: str, queue: str) -> MigrationLock:
        return MigrationLock(self.client, self.key(vhost, queue) + ":lock")


class MigrationLock:
    """One migration process per queue: a lease in Redis, refreshed by a daemon thread
    while the process lives. A ``kill -9`` stops the refreshes, and the lease runs out
    after ``ttl_s``, so a ``--resume`` right after a crash waits at most that long."""

    def __init__(self, client: Any, key: str, ttl_s: float = 10.0) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = int(ttl_s * 1000)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self._stop = threading.Event()
        self._thread: Any = None

    def acquire(self, wait_s: float, echo: Callable[[str], None] = print) -> None:
        deadline = time.monotonic() + wait_s
        told = False
        while not self.client.set(self.key, self.owner, nx=True, px=self.ttl_ms):
            holder = self.client.get(self.key)
            if time.monotonic() > deadline:
                raise MigrationError(
                    f"another migration process holds {self.key} ({holder}); wait for it, or "
                    f"for its lease to run out (at most {self.ttl_ms / 1000:.0f} s after it died)"
                )
            if not told:
                echo(f"waiting for the lease of {holder} (a previous process) to run out")
                told = True
            time.sleep(0.5)
        self._thread = threading.Thread(target=self._refresh, daemon=True, name="migrate-lock")
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            try:
                if not self.client.eval(_CHECK_LUA, 1, self.key, self.owner, self.ttl_ms):
                    return  # lost: the migrating thread stops at its next check
            except Exception:  # Redis away for a moment: the next refresh tries again
                continue

    def check(self, before: str) -> None:
        """Still ours? Compare the token and extend the lease, atomically; else
        :class:`LeaseLost` naming the step ``before`` which this process stopped."""
        if not self.client.eval(_CHECK_LUA, 1, self.key, self.owner, self.ttl_ms):
            raise self.lost(before)

    def lost(self, before: str) -> LeaseLost:
        self._stop.set()
        try:
            holder = self.client.get(self.key)
        except Exception:  # the error says what matters without it
            holder = None
        return LeaseLost(
            f"this process lost the migration's lease ({self.key}) to "
            f"{holder or 'nobody (it ran out)'}: paused, or cut off from Redis, for more than "
            f"{self.ttl_ms / 1000:.0f} s. It stopped before {before}; nothing was deleted or "
            "moved by it since. 'beetle queues migrate QUEUE --status' shows where the "
            "migration stands; --resume carries it on once no other process does"
        )

    def release(self) -> None:
        self._stop.set()
        try:
            if self.client.get(self.key) == self.owner:
                self.client.delete(self.key)
        except Exception:  # the lease runs out by itself
            pass
