"""An in-memory dedup store for unit tests: the pure rules of :mod:`celery_beetle.store.outcome`
over a dict, with the interface of :class:`~celery_beetle.store.redis.RedisStore`.

It exists so that tests of the bootstep and of BeetleTask need no Redis. It is not for
production: it is neither shared between processes nor persistent. The contract suite in
``tests/dedup`` runs the same scenarios against it and against Redis, which is what makes it
a faithful stand-in. TTLs are kept, on the store's clock, so that expiry is testable too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from celery_beetle.store.base import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_TTL_MARGIN_MS,
    REPLAY_MARK_TTL_MS,
    Store,
    wall_clock_ms,
)
from celery_beetle.store.outcome import (
    ClaimDecision,
    FailureDecision,
    FenceDecision,
    Limits,
    RejectDecision,
    Replay,
    ReplayDecision,
    ReplayMark,
    dead_lettered_ttl_ms,
    decide_claim,
    decide_complete,
    decide_dead_lettered,
    decide_extend,
    decide_failure,
    decide_mark_inbox,
    decide_reject,
    decide_release,
    decide_replay,
    decide_start,
    key_ttl_ms,
    replay_mark_ttl_ms,
)
from celery_beetle.store.state import MAX_OWNER_LENGTH, MessageFacts, State

__all__ = ["FakeStore"]

D = TypeVar("D")


class FakeStore(Store):
    """Records in a dict, each with the clock time at which it expires.

    ``round_trips`` counts as Redis would: one per call.
    """

    def __init__(
        self,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ttl_margin_ms: int = DEFAULT_TTL_MARGIN_MS,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        super().__init__(key_prefix=key_prefix, ttl_margin_ms=ttl_margin_ms, clock=clock)
        self.records: dict[str, tuple[State, int]] = {}
        self.seen: dict[str, int] = {}
        #: replay marks: key -> (value, expires at)
        self.marks: dict[str, tuple[str, int]] = {}

    def __repr__(self) -> str:
        return f"<FakeStore {len(self.records)} records prefix={self.key_prefix!r}>"

    def peek(self, scope: str, message_id: str) -> State | None:
        self.round_trips += 1
        now = self.clock()
        return self._get(self._record_key(scope, message_id, now), now)

    def claim(
        self, facts: MessageFacts, limits: Limits, owner: str, reserve_ms: int = 0
    ) -> ClaimDecision:
        owner = owner[:MAX_OWNER_LENGTH]
        return self._apply(
            facts,
            lambda state, now: decide_claim(state, facts, limits, owner, now, reserve_ms),
        )

    def start(self, facts: MessageFacts, token: int, limits: Limits) -> FenceDecision:
        return self._apply(facts, lambda state, now: decide_start(state, token, limits, now))

    def mark_inbox(self, facts: MessageFacts, token: int) -> FenceDecision:
        return self._apply(facts, lambda state, now: decide_mark_inbox(state, token))

    def complete(self, facts: MessageFacts, token: int) -> FenceDecision:
        return self._apply(facts, lambda state, now: decide_complete(state, token))

    def fail(
        self, facts: MessageFacts, token: int, limits: Limits, retryable: bool, owner: str = ""
    ) -> FailureDecision:
        owner = owner[:MAX_OWNER_LENGTH]
        return self._apply(
            facts,
            lambda state, now: decide_failure(state, token, limits, retryable, now, owner),
        )

    def extend(
        self, facts: MessageFacts, token: int, lease_timeout_ms: int, reservation: bool = False
    ) -> FenceDecision:
        return self._apply(
            facts,
            lambda state, now: decide_extend(state, token, lease_timeout_ms, now, reservation),
        )

    def release(self, facts: MessageFacts, token: int, owner: str = "") -> FenceDecision:
        owner = owner[:MAX_OWNER_LENGTH]
        return self._apply(facts, lambda state, now: decide_release(state, token, owner))

    def reject(self, facts: MessageFacts, reason: str, owner: str) -> RejectDecision:
        owner = owner[:MAX_OWNER_LENGTH]
        return self._apply(
            facts, lambda state, now: decide_reject(state, facts, reason, owner, now)
        )

    def dead_lettered(self, facts: MessageFacts) -> bool:
        self.round_trips += 1
        now = self.clock()
        key = self._record_key(facts.scope, facts.message_id, now)
        marked, state = decide_dead_lettered(self._get(key, now))
        if state is not None:
            ttl = dead_lettered_ttl_ms(
                state, now, self.ttl_margin_ms, self.dead_letter_retention_ms
            )
            self.records[key] = (state, now + ttl)
        return marked

    def first_seen(self, facts: MessageFacts, keep_ms: int) -> int:
        self.round_trips += 1
        now = self.clock()
        return self.seen.setdefault(self._record_key(facts.scope, facts.message_id, now), now)

    def forget(self, scope: str, message_id: str) -> bool:
        self.round_trips += 1
        now = self.clock()
        existed = False
        for key in (self.key(scope, message_id), self.legacy_key(scope, message_id)):
            if key is not None:
                existed = self._get(key, now) is not None or existed
                self.records.pop(key, None)
        return existed

    def ttl_ms(self, scope: str, message_id: str) -> int | None:
        self.round_trips += 1
        now = self.clock()
        key = self._record_key(scope, message_id, now)
        if self._get(key, now) is None:
            return None
        return self.records[key][1] - now

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
        mark_key = self.replay_mark_key(scope, message_id)
        current = self._mark(mark_key, now)
        key = self._record_key(scope, message_id, now)
        state = self._get(key, now)
        decision = decide_replay(state, current, replay_id, window_end_ms, now, force)
        if decision is Replay.REPUBLISH:
            marked = ReplayMark.parse(current)
            return ReplayDecision(decision, marked.expires_at_ms if marked else 0)
        if decision is not Replay.RUN:
            return ReplayDecision(decision)
        for record in (self.key(scope, message_id), self.legacy_key(scope, message_id)):
            if record is not None:
                self.records.pop(record, None)
        ttl = replay_mark_ttl_ms(mark_ttl_ms, window_end_ms, expires_at_ms, now, self.ttl_margin_ms)
        self.marks[mark_key] = (ReplayMark(False, replay_id, expires_at_ms).text(), now + ttl)
        return ReplayDecision(decision, expires_at_ms)

    def replay_mark(self, scope: str, message_id: str) -> str | None:
        self.round_trips += 1
        return self._mark(self.replay_mark_key(scope, message_id), self.clock())

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
        ttl = replay_mark_ttl_ms(mark_ttl_ms, 0, expires_at_ms, now, self.ttl_margin_ms)
        mark = ReplayMark(True, replay_id, expires_at_ms).text()
        self.marks[self.replay_mark_key(scope, message_id)] = (mark, now + ttl)

    def _mark(self, mark_key: str, now: int) -> str | None:
        mark = self.marks.get(mark_key)
        return mark[0] if mark is not None and mark[1] > now else None

    def _apply(
        self, facts: MessageFacts, rule: Callable[[State | None, int], tuple[D, State | None]]
    ) -> D:
        """One "script": read, decide by the pure rule, write what it says, as Lua does."""
        self.round_trips += 1
        now = self.clock()
        key = self._record_key(facts.scope, facts.message_id, now)
        decision, state = rule(self._get(key, now), now)
        if state is not None:
            self.records[key] = (state, now + key_ttl_ms(state, now, self.ttl_margin_ms))
        return decision

    def _record_key(self, scope: str, message_id: str, now: int) -> str:
        """The key the record is under: its own, or (as ``scripts/record.lua`` decides) its
        old key while only a worker of the previous version has written it."""
        key = self.key(scope, message_id)
        old = self.legacy_key(scope, message_id)
        if old is not None and self._get(key, now) is None and self._get(old, now) is not None:
            return old
        return key

    def _get(self, key: str, now: int) -> State | None:
        record = self.records.get(key)
        if record is None or record[1] <= now:
            self.records.pop(key, None)
            return None
        return record[0]
