"""The deduplication store: one Redis hash per message, one Lua script per state change.

Each ``(scope, message_id)`` has one record under one hash-tagged key (prefix ``beetle:`` by
default), so Redis Cluster keeps all of a message in one slot; the key's three forms are
described in :mod:`celery_beetle.store.keys` (the common one, ``<prefix>{<scope>:<message_id>}``,
is the key of earlier versions), its fields in :mod:`celery_beetle.store.state`. Every change is
one script from ``scripts/`` (one round trip, atomic), the gate's read is one HMGET, and
every write sets a TTL past the message's expiry: there is no GC daemon.

For one release, a record whose key changed form (a scope with ``:`` or braces, an id with
``:`` or braces or of more than 200 characters) is also looked for under its old key
(:func:`~celery_beetle.store.keys.legacy_key`): every script gets it as ``KEYS[2]`` and works on it
when the record's own key is absent and the old one exists (``scripts/record.lua``), and the
gate reads both in one round trip. So a message whose other copy a worker of the previous
version ran is not run again here during a rolling deploy.

Redis replicates asynchronously, so a write the master acknowledged may be missing on the
replica a Sentinel promotes, and a message whose claim or completion is lost can run again.
``wait_replicas=n`` (``beetle_redis_wait_replicas``) sends every script with ``WAIT n`` in the
same pipeline, still one round trip, and counts a write fewer than ``n`` replicas acknowledged
as not stored (:class:`ReplicaAckTimeout`).

A redundant pair that runs once costs 3 calls when the gate claims (the gate's reservation
and completion, each pipelined with other deliveries' calls, and the pool's start as the
body begins: see :mod:`celery_beetle.worker.gate`; the second copy waits for its twin and is
dropped without one); 3 when the pool claims (gate read, claim, complete); beetle needs
8-9. ``round_trips`` counts them for ``benchmarks/bench_store.py``.

:meth:`RedisStore.from_url` takes the URL forms of :mod:`celery_beetle.settings`: Redis,
Sentinel or Cluster, with or without TLS.

Time comes from the ``clock`` the store is built with (milliseconds), passed to every script:
Redis's own clock is never consulted, so tests move time without sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Protocol

import redis
from redis.cluster import RedisCluster

from celery_beetle.store.address import connect
from celery_beetle.store.base import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_TTL_MARGIN_MS,
    REPLAY_MARK_TTL_MS,
    Store,
    wall_clock_ms,
)
from celery_beetle.store.keys import record_keys
from celery_beetle.store.outcome import (
    DEAD_LETTER_LEASE_MS,
    INBOX_EXTRA_STARTS,
    Claim,
    ClaimDecision,
    Failure,
    FailureDecision,
    Fence,
    FenceDecision,
    GiveUpReason,
    Limits,
    RejectDecision,
    Rejected,
    Replay,
    ReplayDecision,
    ReplayMark,
    replay_mark_ttl_ms,
)
from celery_beetle.store.state import FIELDS, MAX_OWNER_LENGTH, MessageFacts, State, Status

__all__ = [
    "DEFAULT_WAIT_TIMEOUT_MS",
    "RedisStore",
    "ReplicaAckTimeout",
    "ScriptCall",
    "StoreSettings",
    "decoded",
    "first_record",
    "script_source",
]

#: how long ``WAIT`` blocks for replica acks; below the socket timeout, so it answers first
DEFAULT_WAIT_TIMEOUT_MS = 1_000


class StoreSettings(Protocol):
    """What :meth:`RedisStore.from_settings` reads of the settings: the store sits below
    :mod:`celery_beetle.settings` (which imports its rules) and names only these."""

    @property
    def redis_url(self) -> str: ...

    @property
    def key_prefix(self) -> str: ...

    @property
    def key_ttl_margin_ms(self) -> int: ...

    @property
    def redis_wait_replicas(self) -> int: ...

    @property
    def dead_letter_retention_ms(self) -> int: ...


class ReplicaAckTimeout(redis.exceptions.TimeoutError):
    """Fewer replicas than ``wait_replicas`` acknowledged a write in time.

    The write is on the master but might not survive a failover, so it counts as not stored.
    A redis-py ``TimeoutError``, hence one of the store errors the worker already handles: a
    claim hands the message back, a completion or failure is retried until it is stored.
    """


class RedisStore(Store):
    """The store in Redis (standalone, Sentinel or Cluster), one round trip per call.

    Scripts are registered once per store; redis-py sends EVALSHA and loads a script again
    only if the server lost it (a restart, a failover). Nothing is retried here: when Redis
    is unreachable, redis-py's ``ConnectionError`` or ``TimeoutError`` reaches the caller,
    which stops taking messages (gate) or retries the write (a completion may be retried:
    see :func:`~celery_beetle.store.outcome.decide_complete`).

    With ``wait_replicas`` > 0 each script is pipelined with ``WAIT wait_replicas
    wait_timeout_ms``; too few acks raise :class:`ReplicaAckTimeout`. Not for Redis Cluster,
    whose pipelines cannot send ``WAIT`` on the connection that wrote.
    """

    SCRIPTS = (
        "claim",
        "start",
        "mark_inbox",
        "complete",
        "fail",
        "extend",
        "release",
        "reject",
        "dead_lettered",
        "first_seen",
    )

    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ttl_margin_ms: int = DEFAULT_TTL_MARGIN_MS,
        clock: Callable[[], int] = wall_clock_ms,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        super().__init__(key_prefix=key_prefix, ttl_margin_ms=ttl_margin_ms, clock=clock)
        if wait_replicas < 0 or wait_timeout_ms <= 0:
            raise ValueError(
                f"wait_replicas must be 0 or more and wait_timeout_ms positive, "
                f"got {wait_replicas} and {wait_timeout_ms}"
            )
        if wait_replicas and isinstance(client, RedisCluster):
            raise ValueError("wait_replicas is not supported on Redis Cluster")
        self.client = client
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._scripts = {name: client.register_script(script_source(name)) for name in self.SCRIPTS}
        self._replay_script = client.register_script(script_source("replay", prepend=False))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ttl_margin_ms: int = DEFAULT_TTL_MARGIN_MS,
        clock: Callable[[], int] = wall_clock_ms,
        wait_replicas: int = 0,
        **client_kwargs: Any,
    ) -> RedisStore:
        """A store on a URL of :mod:`celery_beetle.settings`. Redis and Sentinel clients
        connect on first use; a Cluster client connects at once, to learn its slots."""
        return cls(
            connect(url, **client_kwargs),
            key_prefix=key_prefix,
            ttl_margin_ms=ttl_margin_ms,
            clock=clock,
            wait_replicas=wait_replicas,
        )

    @classmethod
    def from_settings(
        cls, settings: StoreSettings, *, clock: Callable[[], int] = wall_clock_ms
    ) -> RedisStore:
        """The store that ``app.conf`` describes (a
        :class:`~celery_beetle.settings.BeetleSettings`)."""
        store = cls.from_url(
            settings.redis_url,
            key_prefix=settings.key_prefix,
            ttl_margin_ms=settings.key_ttl_margin_ms,
            clock=clock,
            wait_replicas=settings.redis_wait_replicas,
        )
        store.dead_letter_retention_ms = settings.dead_letter_retention_ms
        return store

    def __repr__(self) -> str:
        return f"<RedisStore {self.client!r} prefix={self.key_prefix!r}>"

    def record_keys(self, scope: str, message_id: str) -> list[str]:
        """The record's key, and its old key where one is read (:mod:`celery_beetle.store.keys`):
        on Redis Cluster only if both hash to one slot, as one script must touch them."""
        key, old = record_keys(self.key_prefix, scope, message_id)
        keys = [key]
        if old is not None and (
            not isinstance(self.client, RedisCluster)
            or self.client.keyslot(old) == self.client.keyslot(keys[0])
        ):
            keys.append(old)
        return keys

    def peek(self, scope: str, message_id: str) -> State | None:
        self.round_trips += 1
        keys = self.record_keys(scope, message_id)
        if len(keys) == 1:
            return State.from_values(self.client.hmget(keys[0], FIELDS))
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, FIELDS)
        return first_record(pipe.execute())

    def claim(
        self, facts: MessageFacts, limits: Limits, owner: str, reserve_ms: int = 0
    ) -> ClaimDecision:
        return self.execute(self.claim_call(facts, limits, owner, reserve_ms))

    def claim_call(
        self, facts: MessageFacts, limits: Limits, owner: str, reserve_ms: int = 0
    ) -> ScriptCall:
        """The claim as a :class:`ScriptCall`, for a caller that batches it (the gate)."""
        now = self.clock()
        args = (
            now,
            facts.expires_at_ms,
            limits.lease_timeout_ms,
            limits.attempts,
            owner[:MAX_OWNER_LENGTH],
            self.ttl_margin_ms,
            DEAD_LETTER_LEASE_MS,
            reserve_ms,
            INBOX_EXTRA_STARTS,
        )
        return self._call("claim", facts, args, lambda reply: _claim_decision(reply, now))

    def start(self, facts: MessageFacts, token: int, limits: Limits) -> FenceDecision:
        args = (token, self.clock(), limits.lease_timeout_ms, self.ttl_margin_ms)
        return self.execute(self._call("start", facts, args, _fence))

    def mark_inbox(self, facts: MessageFacts, token: int) -> FenceDecision:
        return self.execute(self._call("mark_inbox", facts, (token,), _fence))

    def complete(self, facts: MessageFacts, token: int) -> FenceDecision:
        return self.execute(self.complete_call(facts, token))

    def complete_call(self, facts: MessageFacts, token: int) -> ScriptCall:
        """The completion as a :class:`ScriptCall`, for a caller that batches it."""
        return self._call("complete", facts, (token, self.clock(), self.ttl_margin_ms), _fence)

    def fail(
        self, facts: MessageFacts, token: int, limits: Limits, retryable: bool, owner: str = ""
    ) -> FailureDecision:
        reply = self._run(
            "fail",
            facts,
            token,
            self.clock(),
            limits.attempts,
            limits.exceptions,
            int(retryable),
            limits.delay_ms,
            limits.max_delay_ms,
            self.ttl_margin_ms,
            owner[:MAX_OWNER_LENGTH],
            DEAD_LETTER_LEASE_MS,
        )
        if reply[0] == "retry":
            delay, not_before, attempts, exceptions = reply[1:]
            return FailureDecision(Failure.RETRY, delay, not_before, None, attempts, exceptions)
        if reply[0] == "give_up":
            reason, attempts, exceptions = reply[1:]
            return FailureDecision(
                Failure.GIVE_UP,
                reason=GiveUpReason(reason),
                attempts=attempts,
                exceptions=exceptions,
            )
        return FailureDecision(Failure.NOT_OWNER)

    def extend(
        self, facts: MessageFacts, token: int, lease_timeout_ms: int, reservation: bool = False
    ) -> FenceDecision:
        return self.execute(self.extend_call(facts, token, lease_timeout_ms, reservation))

    def extend_call(
        self, facts: MessageFacts, token: int, lease_timeout_ms: int, reservation: bool = False
    ) -> ScriptCall:
        """The extension as a :class:`ScriptCall` (the gate batches its renewals)."""
        args = (token, self.clock(), lease_timeout_ms, self.ttl_margin_ms, int(reservation))
        return self._call("extend", facts, args, _fence)

    def release(self, facts: MessageFacts, token: int, owner: str = "") -> FenceDecision:
        owner = owner[:MAX_OWNER_LENGTH]
        return _fence(self._run("release", facts, token, self.clock(), self.ttl_margin_ms, owner))

    def reject(self, facts: MessageFacts, reason: str, owner: str) -> RejectDecision:
        now = self.clock()
        reply = self._run(
            "reject",
            facts,
            now,
            facts.expires_at_ms,
            self.ttl_margin_ms,
            reason,
            owner[:MAX_OWNER_LENGTH],
            DEAD_LETTER_LEASE_MS,
        )
        if reply[0] == "wait":
            return RejectDecision(Rejected.WAIT, reply[1] - now)
        return RejectDecision(Rejected(reply[0]))

    def dead_lettered(self, facts: MessageFacts) -> bool:
        reply = self._run(
            "dead_lettered",
            facts,
            self.clock(),
            self.ttl_margin_ms,
            self.dead_letter_retention_ms,
        )
        return reply[0] == "ok"

    def first_seen(self, facts: MessageFacts, keep_ms: int) -> int:
        return int(self._run("first_seen", facts, self.clock(), keep_ms)[0])

    def forget(self, scope: str, message_id: str) -> bool:
        self.round_trips += 1
        return bool(self.client.delete(*self.record_keys(scope, message_id)))

    def ttl_ms(self, scope: str, message_id: str) -> int | None:
        self.round_trips += 1
        keys = self.record_keys(scope, message_id)
        if len(keys) == 1:
            ttls = [self.client.pttl(keys[0])]
        else:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.pttl(key)
            ttls = pipe.execute()
        ttl = next((t for t in ttls if t != -2), -2)
        return None if ttl == -2 else ttl

    def replay(
        self,
        scope: str,
        message_id: str,
        replay_id: str,
        *,
        window_end_ms: int = 0,
        expires_at_ms: int = 0,
        force: bool = False,
        mark_ttl_ms: int = REPLAY_MARK_TTL_MS,
    ) -> ReplayDecision:
        self.round_trips += 1
        now = self.clock()
        keys = [self.replay_mark_key(scope, message_id), *self.record_keys(scope, message_id)]
        ttl = replay_mark_ttl_ms(mark_ttl_ms, window_end_ms, expires_at_ms, now, self.ttl_margin_ms)
        args = [replay_id, ttl, now, window_end_ms, expires_at_ms, "1" if force else "0"]
        reply = decoded(self._replay_script(keys=keys, args=args))
        return ReplayDecision(Replay(reply[0]), int(reply[1]) if len(reply) > 1 else 0)

    def replay_published(
        self,
        scope: str,
        message_id: str,
        replay_id: str,
        expires_at_ms: int = 0,
        mark_ttl_ms: int = REPLAY_MARK_TTL_MS,
    ) -> None:
        self.round_trips += 1
        now = self.clock()
        mark = ReplayMark(True, replay_id, expires_at_ms).text()
        ttl = replay_mark_ttl_ms(mark_ttl_ms, 0, expires_at_ms, now, self.ttl_margin_ms)
        self.client.set(self.replay_mark_key(scope, message_id), mark, px=ttl)

    def replay_mark(self, scope: str, message_id: str) -> str | None:
        self.round_trips += 1
        value = self.client.get(self.replay_mark_key(scope, message_id))
        return value.decode() if isinstance(value, bytes) else value

    def ping(self) -> bool:
        """True if Redis answers; the worker pauses consuming while it does not."""
        self.round_trips += 1
        return bool(self.client.ping())

    def close(self) -> None:
        self.client.close()

    def _run(self, name: str, facts: MessageFacts, *args: Any) -> list[Any]:
        return self.execute(self._call(name, facts, args, list))

    def _call(
        self,
        name: str,
        facts: MessageFacts,
        args: Sequence[Any],
        parse: Callable[[list[Any]], Any],
    ) -> ScriptCall:
        script = self._scripts[name]
        return ScriptCall(script, self.record_keys(facts.scope, facts.message_id), args, parse)

    def execute(self, call: ScriptCall) -> Any:
        """Run ``call`` now (one round trip) and return its parsed reply."""
        self.round_trips += 1
        if self.wait_replicas:
            reply = self._run_and_wait(call.script, call.keys, call.args)
        else:
            reply = call.script(keys=call.keys, args=call.args)
        return call.parse(decoded(reply))

    def _run_and_wait(self, script: Any, keys: list[str], args: Sequence[Any]) -> Any:
        """EVALSHA, then WAIT on the same connection, in one round trip."""
        for loaded in (False, True):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            reply, acked = pipe.execute(raise_on_error=False)
            if isinstance(reply, redis.exceptions.NoScriptError) and not loaded:
                self.client.script_load(script.script)  # lost by the server (a failover)
                continue
            for value in (reply, acked):
                if isinstance(value, Exception):
                    raise value
            if acked < self.wait_replicas:
                raise ReplicaAckTimeout(
                    f"{acked} of {self.wait_replicas} replica(s) acknowledged the write "
                    f"within {self.wait_timeout_ms} ms"
                )
            return reply
        raise AssertionError("unreachable")


class ScriptCall:
    """One script call, ready to run: now (:meth:`RedisStore.execute`) or in a batch (the
    gate's :mod:`~celery_beetle.worker.gate_reads`). ``parse`` turns the decoded reply into the
    decision the synchronous method returns."""

    __slots__ = ("args", "keys", "parse", "script")

    def __init__(
        self, script: Any, keys: list[str], args: Sequence[Any], parse: Callable[[list[Any]], Any]
    ) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.parse = parse

    def command(self) -> tuple[Any, ...]:
        """The ``EVALSHA`` command (a server that lost the script answers NOSCRIPT)."""
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def decoded(reply: Any) -> list[Any]:
    """A script's reply as a list, bytes decoded (clients may or may not decode)."""
    if not isinstance(reply, list):
        reply = [reply]
    return [v.decode() if isinstance(v, bytes) else v for v in reply]


def _claim_decision(reply: Sequence[Any], now: int) -> ClaimDecision:
    code = reply[0]
    if code == "acquired":
        return ClaimDecision(
            Claim.ACQUIRED,
            token=reply[1],
            attempt=reply[2],
            lease_deadline_ms=reply[3],
            taken_over=len(reply) > 4 and bool(reply[4]),
        )
    if code == "done":
        return ClaimDecision(Claim.ALREADY_DONE, status=Status(reply[1]))
    if code == "locked":
        return ClaimDecision(
            Claim.LOCKED, lease_deadline_ms=reply[1], delay_ms=reply[1] - now, owner=reply[2]
        )
    if code == "delayed":
        return ClaimDecision(Claim.DELAYED, delay_ms=reply[1] - now)
    if code == "dead_letter":
        return ClaimDecision(
            Claim.DEAD_LETTER, reason=reply[1], attempt=reply[2], exceptions=reply[3]
        )
    if code == "expired":
        return ClaimDecision(Claim.EXPIRED)
    raise RuntimeError(f"claim.lua answered {reply!r}")


def _fence(reply: Sequence[Any]) -> FenceDecision:
    """Read the {'ok'[, deadline[, attempt]]} / {'not_owner', status, token} replies."""
    if reply[0] == "ok":
        return FenceDecision(
            Fence.OK,
            lease_deadline_ms=reply[1] if len(reply) > 1 else 0,
            attempt=reply[2] if len(reply) > 2 else 0,
        )
    return FenceDecision(
        Fence.NOT_OWNER, status=Status(reply[1]) if reply[1] else None, token=reply[2]
    )


def first_record(replies: Sequence[Sequence[Any]]) -> State | None:
    """The record from the HMGETs of its key and then its old key: the first one present."""
    for values in replies:
        state = State.from_values(values)
        if state is not None:
            return state
    return None


def script_source(name: str, prepend: bool = True) -> str:
    """The text of ``scripts/<name>.lua`` (package data) after ``scripts/record.lua``,
    which picks the key the script works on (not for ``replay.lua``: it reads both keys)."""
    scripts = resources.files("celery_beetle.store") / "scripts"
    own = (scripts / f"{name}.lua").read_text()
    return (scripts / "record.lua").read_text() + own if prepend else own
