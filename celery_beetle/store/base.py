"""What the worker needs of a dedup store: :class:`Store`, one method per rule.

:class:`~.redis.RedisStore` runs each method as one Lua script in Redis;
:class:`~.fake.FakeStore` applies the same rule (:mod:`.outcome`) to a dict. One contract
suite (``tests/dedup``) runs against both, so a caller can be tested with the fake and run
on Redis. Times are milliseconds from the store's ``clock``: the store never reads a clock
of its own, so tests move time without sleeping.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable

from celery_beetle.store.keys import legacy_key, record_key, replay_mark_key
from celery_beetle.store.outcome import (
    DEAD_LETTER_RETENTION_MS,
    ClaimDecision,
    FailureDecision,
    FenceDecision,
    GateDecision,
    Limits,
    RejectDecision,
    ReplayDecision,
    decide_gate,
)
from celery_beetle.store.state import MessageFacts, State

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_TTL_MARGIN_MS",
    "REPLAY_MARK_TTL_MS",
    "Store",
    "wall_clock_ms",
]

DEFAULT_KEY_PREFIX = "beetle:"
#: how long a replay mark is kept: a dead letter's copy on a broker that was down during its
#: replay is recognised as replayed for this long (30 days)
REPLAY_MARK_TTL_MS = 30 * 86_400_000
DEFAULT_TTL_MARGIN_MS = 3_600_000


def wall_clock_ms() -> int:
    """The default clock: Unix time in milliseconds."""
    return time.time_ns() // 1_000_000


class Store(abc.ABC):
    """What the worker needs from a dedup store; :class:`~.redis.RedisStore` and the in-memory
    :class:`~celery_beetle.store.fake.FakeStore` share it, and one contract suite tests both.

    Times are milliseconds from ``clock``. ``round_trips`` counts calls to the server.
    """

    def __init__(
        self,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ttl_margin_ms: int = DEFAULT_TTL_MARGIN_MS,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if ttl_margin_ms <= 0:
            raise ValueError(f"ttl_margin_ms must be positive, got {ttl_margin_ms}")
        self.key_prefix = key_prefix
        self.ttl_margin_ms = ttl_margin_ms
        self.clock = clock
        self.round_trips = 0

    def key(self, scope: str, message_id: str) -> str:
        """The record's key (:func:`~celery_beetle.store.keys.record_key`): one Redis Cluster
        hash slot per message."""
        return record_key(self.key_prefix, scope, message_id)

    def legacy_key(self, scope: str, message_id: str) -> str | None:
        """The record's key in the previous version, when it differs; read for one release."""
        return legacy_key(self.key_prefix, scope, message_id)

    def gate(self, facts: MessageFacts) -> GateDecision:
        """The main process's verdict on a delivery: one read, none if the message expired."""
        now = self.clock()
        if facts.expires_at_ms <= now:
            return decide_gate(None, facts, now)
        return decide_gate(self.peek(facts.scope, facts.message_id), facts, now)

    @abc.abstractmethod
    def peek(self, scope: str, message_id: str) -> State | None:
        """The stored record, or None: the gate's one read."""

    @abc.abstractmethod
    def claim(
        self, facts: MessageFacts, limits: Limits, owner: str, reserve_ms: int = 0
    ) -> ClaimDecision:
        """Take the lease before the body runs, or (``reserve_ms``) a reservation for a
        delivery that waits for a pool process (:func:`~.outcome.decide_claim`)."""

    @abc.abstractmethod
    def start(self, facts: MessageFacts, token: int, limits: Limits) -> FenceDecision:
        """The body begins on the reservation ``token``: the attempt counts, the full lease
        starts (:func:`~celery_beetle.store.outcome.decide_start`)."""

    @abc.abstractmethod
    def mark_inbox(self, facts: MessageFacts, token: int) -> FenceDecision:
        """The running body commits through the inbox
        (:func:`~celery_beetle.store.outcome.decide_mark_inbox`)."""

    @abc.abstractmethod
    def complete(self, facts: MessageFacts, token: int) -> FenceDecision:
        """Record success under the claim's token (:func:`~.outcome.decide_complete`)."""

    @abc.abstractmethod
    def fail(
        self, facts: MessageFacts, token: int, limits: Limits, retryable: bool, owner: str = ""
    ) -> FailureDecision:
        """Record an exception: retry later or give up, the dead letter then owed by
        ``owner`` (:func:`~.outcome.decide_failure`)."""

    @abc.abstractmethod
    def extend(
        self, facts: MessageFacts, token: int, lease_timeout_ms: int, reservation: bool = False
    ) -> FenceDecision:
        """Lengthen the owner's lease, or renew a reservation whose body has not begun
        (:func:`~.outcome.decide_extend`)."""

    @abc.abstractmethod
    def release(self, facts: MessageFacts, token: int, owner: str = "") -> FenceDecision:
        """Give the message back unrun; token 0 releases ``owner``'s claim
        (:func:`~.outcome.decide_release`)."""

    @abc.abstractmethod
    def reject(self, facts: MessageFacts, reason: str, owner: str) -> RejectDecision:
        """Fail bad input without a run (:func:`~.outcome.decide_reject`): only the first
        copy to ask is dead-lettered."""

    @abc.abstractmethod
    def dead_lettered(self, facts: MessageFacts) -> bool:
        """The dead letter owed is stored (:func:`~.outcome.decide_dead_lettered`)."""

    @abc.abstractmethod
    def first_seen(self, facts: MessageFacts, keep_ms: int) -> int:
        """When a message a worker could not take (an unknown task) was first seen, in ms;
        the mark lives ``keep_ms`` unless the record has a TTL of its own."""

    @abc.abstractmethod
    def forget(self, scope: str, message_id: str) -> bool:
        """Delete a record, and its old-form copy (e.g. before replaying a dead-lettered
        message); True if one existed."""

    @abc.abstractmethod
    def ttl_ms(self, scope: str, message_id: str) -> int | None:
        """Milliseconds until the record expires; None if there is no record."""

    #: a record whose dead letter is stored is kept this long at least (``dead_lettered``)
    dead_letter_retention_ms: int = DEAD_LETTER_RETENTION_MS

    @abc.abstractmethod
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
        """May the dead letter ``replay_id`` of this message be replayed
        (:func:`~.outcome.decide_replay`)? ``window_end_ms``: the dead letter's message's
        expiry (0: unknown); ``expires_at_ms``: the expiry of the copy this replay would
        publish. On RUN the record is deleted and the mark ``r:<replay_id>:<expires_at_ms>``
        written, kept for :func:`~.outcome.replay_mark_ttl_ms`."""

    @abc.abstractmethod
    def replay_published(
        self,
        scope: str,
        message_id: str,
        replay_id: str,
        expires_at_ms: int = 0,
        mark_ttl_ms: int = REPLAY_MARK_TTL_MS,
    ) -> None:
        """The replay's publish (of a copy expiring at ``expires_at_ms``) is confirmed: mark
        ``p:<replay_id>:<expires_at_ms>``, so a later replay of the same dead letter only
        acks it."""

    @abc.abstractmethod
    def replay_mark(self, scope: str, message_id: str) -> str | None:
        """The message's replay mark (``r:<id>`` or ``p:<id>``), None if there is none."""

    def replay_mark_key(self, scope: str, message_id: str) -> str:
        return replay_mark_key(self.key_prefix, scope, message_id)
