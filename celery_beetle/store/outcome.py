"""The deduplication rules, as pure functions from (stored state, message, limits, now).

Every decision the worker takes about a delivery is made here, named by an enum and returned
as data (:mod:`.decisions`, re-exported here), with no Redis and no clock of its own: the
caller passes ``now_ms``. Each ``decide_*``
function returns ``(decision, state_to_write)``; ``state_to_write`` is None when nothing changes.
:class:`~celery_beetle.store.fake.FakeStore` is these functions over a dict, and the Lua
scripts in ``scripts/`` apply the same rules atomically in Redis; the contract tests in
``tests/dedup`` run one suite against both, so the two cannot drift apart.

The steps of one delivery (see ``design.md``, "Deduplication"):

``decide_gate``
    In the worker's main process, from one read: run it, drop a duplicate, defer a copy
    whose twin runs (or waits for its retry), or drop an expired message.
``decide_claim``
    Before the body runs: a new fencing token and the lease, or why not. The gate's claim
    (in its batch, before a pool process is free) is a *reservation*: a short lease that
    counts no attempt; the pool's claim (no gate claim: an ETA task, Redis Cluster, replicas
    to wait for) is a start at once.
``decide_start``
    In the pool, as the body begins on the gate's reservation: the attempt counts and the
    full lease starts. ``attempts`` counts only this: a body that began.
``decide_complete`` / ``decide_failure``
    After the body: only the holder of the current token may record the result. A failure
    is retried after an exponential backoff until a limit is reached, as in beetle:
    ``attempts`` bounds how often the body starts (crashes included), ``exceptions`` how
    many exceptions are tolerated, ``retry_on`` which ones.
``decide_extend`` / ``decide_release``
    The owner lengthens its lease (or the gate renews a reservation), or hands the message
    back unrun.
``decide_mark_inbox``
    The body commits its effects through the inbox: a run cut short after that may start
    again past ``attempts`` (to find its row and return), up to
    :data:`INBOX_EXTRA_STARTS` more.
``decide_reject`` / ``decide_dead_lettered``
    Bad input is failed without a run; a failed message's dead letter is owed until the
    worker that published it says so (see :mod:`celery_beetle.store.state`).
``decide_replay``
    An operator replays a dead letter (:mod:`celery_beetle.ops.replay`): reset the
    record for a fresh run, publish again what a broken-off replay of it began, leave it,
    or refuse what the store cannot prove did not complete (past the dedup window).

Every write an owner makes can be retried after a lost reply and is recognised as its own:
a claim by the same owner gets its lease back (not a second attempt), a completion or a
failure under the same token answers as the first time did.

Expiry is checked first everywhere: it is a fact of the message, so the gate can drop an
expired copy without reading Redis at all.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeGuard

from celery_beetle.store.backoff import backoff_ms
from celery_beetle.store.decisions import (
    Claim,
    ClaimDecision,
    Failure,
    FailureDecision,
    Fence,
    FenceDecision,
    Gate,
    GateDecision,
    GiveUpReason,
    Limits,
    RejectDecision,
    Rejected,
    Replay,
    ReplayDecision,
    ReplayMark,
)
from celery_beetle.store.state import MessageFacts, State, Status

__all__ = [
    "INBOX_EXTRA_STARTS",
    "RESERVATION_MS",
    "Claim",
    "ClaimDecision",
    "Failure",
    "FailureDecision",
    "Fence",
    "FenceDecision",
    "Gate",
    "GateDecision",
    "GiveUpReason",
    "Limits",
    "RejectDecision",
    "Rejected",
    "Replay",
    "ReplayDecision",
    "ReplayMark",
    "decide_claim",
    "decide_complete",
    "decide_dead_lettered",
    "decide_extend",
    "decide_failure",
    "decide_gate",
    "decide_mark_inbox",
    "decide_reject",
    "decide_release",
    "decide_replay",
    "decide_start",
    "key_ttl_ms",
]

#: How long the worker that gave a message up has to publish its dead letter before another
#: copy's worker may do it instead (a publish retries for a few confirm timeouts).
DEAD_LETTER_LEASE_MS = 30_000

#: How long the gate's claim holds a message for a delivery that waits for a pool process,
#: unless the gate renews it (every third of it). A worker killed with deliveries waiting
#: in its pool leaves them to any other copy within this, not after a whole lease; a body
#: never starts on a reservation: the pool's start replaces it with the full lease.
RESERVATION_MS = 10_000

#: How many more starts than ``attempts`` a message gets whose body marked its effects in
#: the inbox (:mod:`celery_beetle.outbox.inbox`) and was then cut short by a crash: the
#: next run finds the inbox row (or, when the crash came before the commit, does the work
#: under the inbox's protection). Bounded so that a body that kills its worker every time
#: still ends in the dead-letter queue.
INBOX_EXTRA_STARTS = 2


def decide_gate(state: State | None, facts: MessageFacts, now_ms: int) -> GateDecision:
    """The main process's verdict from one read; it never writes."""
    if facts.expires_at_ms <= now_ms:
        return GateDecision(Gate.DROP_EXPIRED, status=state.status if state else None)
    if state is None:
        return GateDecision(Gate.RUN)
    if state.settled:
        return GateDecision(Gate.DROP_DUPLICATE, status=state.status)
    if state.status is Status.FAILED:  # its dead letter is owed: whoever gave up publishes it
        if state.lease_deadline_ms > now_ms:
            return GateDecision(Gate.DEFER, state.lease_deadline_ms - now_ms, state.status)
        return GateDecision(Gate.RUN, status=state.status)  # the claim hands it over
    if state.status is Status.RUNNING and state.lease_deadline_ms > now_ms:
        return GateDecision(Gate.DEFER, state.lease_deadline_ms - now_ms, state.status)
    if state.status is Status.PENDING and state.retry_not_before_ms > now_ms:
        return GateDecision(Gate.DEFER, state.retry_not_before_ms - now_ms, state.status)
    # A lease that ran out (its worker died) or a retry that is due: the claim decides.
    return GateDecision(Gate.RUN, status=state.status)


def decide_claim(
    state: State | None,
    facts: MessageFacts,
    limits: Limits,
    owner: str,
    now_ms: int,
    reserve_ms: int = 0,
) -> tuple[ClaimDecision, State | None]:
    """Grant a claim, or say why not. A lease that ran out after a body began counts as a
    failed attempt; a reservation that ran out (its body never began) counts nothing.

    ``reserve_ms`` > 0 (the gate's claim): a reservation of that length, no attempt counted;
    the decision's ``attempt`` is the one its start will count. 0 (the pool's claim): a
    start, counted at once, with the full lease.

    A claim by the owner that holds the record is its own, retried after a lost reply: it
    gets the same token back, with the lease (or reservation) counted from now; a start
    over its own reservation counts the attempt then.
    """
    if facts.expires_at_ms <= now_ms:
        return ClaimDecision(Claim.EXPIRED), None
    if state is None:
        state = State(Status.PENDING, expires_at_ms=facts.expires_at_ms)
    elif state.settled:
        return ClaimDecision(Claim.ALREADY_DONE, status=state.status), None
    elif state.status is Status.RUNNING and owner and state.owner == owner:
        if state.reserved and not reserve_ms:
            return _started(state, limits, now_ms)
        deadline = now_ms + (reserve_ms if state.reserved else limits.lease_timeout_ms)
        attempt = state.attempts + 1 if state.reserved else state.attempts
        decision = ClaimDecision(
            Claim.ACQUIRED, token=state.token, attempt=attempt, lease_deadline_ms=deadline
        )
        return decision, replace(state, lease_deadline_ms=deadline)
    elif state.status is Status.FAILED:  # its dead letter is owed
        if state.lease_deadline_ms > now_ms and state.owner != owner:
            return _locked(state, now_ms), None
        return _dead_letter(state, state.reason, owner, now_ms)
    elif state.status is Status.RUNNING and state.lease_deadline_ms > now_ms:
        return _locked(state, now_ms), None
    elif state.status is Status.PENDING and state.retry_not_before_ms > now_ms:
        return ClaimDecision(Claim.DELAYED, delay_ms=state.retry_not_before_ms - now_ms), None
    elif state.attempts >= _start_limit(state, limits):
        failed = _settled(state, Status.FAILED)
        return _dead_letter(failed, GiveUpReason.ATTEMPTS_LIMIT.value, owner, now_ms)
    reserve = reserve_ms > 0
    deadline = now_ms + (reserve_ms if reserve else limits.lease_timeout_ms)
    running = replace(
        state,
        status=Status.RUNNING,
        attempts=state.attempts if reserve else state.attempts + 1,
        lease_deadline_ms=deadline,
        retry_not_before_ms=0,
        owner=owner,
        token=state.token + 1,
        # the later of the copies' expiries: a replay's fresh copy may meet an older twin
        expires_at_ms=max(state.expires_at_ms, facts.expires_at_ms),
        reserved=reserve,
    )
    decision = ClaimDecision(
        Claim.ACQUIRED,
        token=running.token,
        attempt=state.attempts + 1,
        lease_deadline_ms=deadline,
        # a body that began and was cut short (not a reservation nobody started)
        taken_over=state.status is Status.RUNNING and not state.reserved,
    )
    return decision, running


def decide_start(
    state: State | None, token: int, limits: Limits, now_ms: int
) -> tuple[FenceDecision, State | None]:
    """The body begins on the gate's reservation ``token``: count the attempt and start the
    full lease. Only the holder of the token may start, so a reservation another copy took
    over after it ran out never starts here (NOT_OWNER: the delivery goes back to the
    gate). A start already counted under this token (a retry after a lost reply) answers
    as the first one did."""
    if not _owns(state, token):
        return _not_owner(state), None
    if not state.reserved:
        decision = FenceDecision(
            Fence.OK, lease_deadline_ms=state.lease_deadline_ms, attempt=state.attempts
        )
        return decision, None
    claim, started = _started(state, limits, now_ms)
    return FenceDecision(
        Fence.OK, lease_deadline_ms=claim.lease_deadline_ms, attempt=claim.attempt
    ), started


def _started(state: State, limits: Limits, now_ms: int) -> tuple[ClaimDecision, State]:
    deadline = now_ms + limits.lease_timeout_ms
    started = replace(
        state, attempts=state.attempts + 1, lease_deadline_ms=deadline, reserved=False
    )
    decision = ClaimDecision(
        Claim.ACQUIRED, token=state.token, attempt=started.attempts, lease_deadline_ms=deadline
    )
    return decision, started


def _start_limit(state: State, limits: Limits) -> int:
    """How many starts a message may have: ``attempts``, and a few more for a body that
    committed through the inbox and was cut short (it finds its row on the next run)."""
    if state.inbox and state.status is Status.RUNNING:
        return limits.attempts + INBOX_EXTRA_STARTS
    return limits.attempts


def _locked(state: State, now_ms: int) -> ClaimDecision:
    return ClaimDecision(
        Claim.LOCKED,
        lease_deadline_ms=state.lease_deadline_ms,
        delay_ms=state.lease_deadline_ms - now_ms,
        owner=state.owner,
    )


def _dead_letter(state: State, reason: str, owner: str, now_ms: int) -> tuple[ClaimDecision, State]:
    """``owner`` publishes the dead letter of a failed message, under a lease of its own."""
    owed = _owing(state, reason, owner, now_ms)
    decision = ClaimDecision(
        Claim.DEAD_LETTER, attempt=state.attempts, reason=reason, exceptions=state.exceptions
    )
    return decision, owed


def _owing(state: State, reason: str, owner: str, now_ms: int) -> State:
    """Failed, with its dead letter owed by ``owner`` until the lease ends."""
    return replace(
        state,
        status=Status.FAILED,
        dead_letter_owed=True,
        reason=reason,
        owner=owner,
        lease_deadline_ms=now_ms + DEAD_LETTER_LEASE_MS,
        retry_not_before_ms=0,
        reserved=False,
        inbox=False,
    )


def decide_complete(state: State | None, token: int) -> tuple[FenceDecision, State | None]:
    """Record success, only for the current owner.

    A lease that ran out still completes if nobody has claimed since: the body ran once,
    and the token proves no other run started. Completing again with the same token is
    accepted and changes nothing, so a completion whose reply was lost can be retried.
    """
    if state is not None and state.status is Status.COMPLETED and state.token == token:
        return FenceDecision(Fence.OK), None
    if not _owns(state, token):
        return _not_owner(state), None
    return FenceDecision(Fence.OK), _settled(state, Status.COMPLETED)


def decide_failure(
    state: State | None,
    token: int,
    limits: Limits,
    retryable: bool,
    now_ms: int,
    owner: str = "",
) -> tuple[FailureDecision, State | None]:
    """Count the exception; retry after a backoff within the limits, else give up.

    ``retryable`` says whether the exception is one of the task's ``retry_on`` (the caller
    matches classes; Lua cannot). Of several reasons to give up, the first in this order is
    reported: not retryable, attempts limit, exceptions limit. A give-up leaves the dead
    letter owed by ``owner``. The same failure reported again (its reply was lost) gets the
    same answer and changes nothing.
    """
    applied = _applied_failure(state, token, owner, now_ms)
    if applied is not None:
        return applied, None
    if not _owns(state, token):
        return FailureDecision(Failure.NOT_OWNER), None
    exceptions = state.exceptions + 1
    reason = None
    if not retryable:
        reason = GiveUpReason.NOT_RETRYABLE
    elif state.attempts >= limits.attempts:
        reason = GiveUpReason.ATTEMPTS_LIMIT
    elif exceptions > limits.exceptions:
        reason = GiveUpReason.EXCEPTIONS_LIMIT
    if reason is not None:
        failed = _owing(replace(state, exceptions=exceptions), reason.value, owner, now_ms)
        decision = FailureDecision(
            Failure.GIVE_UP, reason=reason, attempts=state.attempts, exceptions=exceptions
        )
        return decision, failed
    delay = backoff_ms(exceptions, limits.delay_ms, limits.max_delay_ms)
    pending = replace(
        _settled(state, Status.PENDING),
        exceptions=exceptions,
        retry_not_before_ms=now_ms + delay,
    )
    decision = FailureDecision(
        Failure.RETRY,
        delay_ms=delay,
        retry_not_before_ms=now_ms + delay,
        attempts=state.attempts,
        exceptions=exceptions,
    )
    return decision, pending


_GIVE_UP_REASONS = frozenset(reason.value for reason in GiveUpReason)


def _applied_failure(
    state: State | None, token: int, owner: str, now_ms: int
) -> FailureDecision | None:
    """The answer a failure under ``token`` got, if it was recorded already."""
    if state is None or state.token != token:
        return None
    if state.status is Status.PENDING:
        return FailureDecision(
            Failure.RETRY,
            delay_ms=max(state.retry_not_before_ms - now_ms, 0),
            retry_not_before_ms=state.retry_not_before_ms,
            attempts=state.attempts,
            exceptions=state.exceptions,
        )
    given_up = state.reason in _GIVE_UP_REASONS
    if (
        state.status is Status.FAILED
        and state.dead_letter_owed
        and state.owner == owner
        and given_up
    ):
        return FailureDecision(
            Failure.GIVE_UP,
            reason=GiveUpReason(state.reason),
            attempts=state.attempts,
            exceptions=state.exceptions,
        )
    return None


def decide_extend(
    state: State | None,
    token: int,
    lease_timeout_ms: int,
    now_ms: int,
    reservation: bool = False,
) -> tuple[FenceDecision, State | None]:
    """Move the owner's lease deadline to ``now + lease_timeout_ms``.

    ``reservation``: the gate renews the reservation of a delivery still waiting for a pool
    process; once its body has begun the record holds the full lease, which a renewal must
    not shorten: OK with the running lease's deadline, and nothing written."""
    if not _owns(state, token):
        return _not_owner(state), None
    if reservation and not state.reserved:
        return FenceDecision(Fence.OK, lease_deadline_ms=state.lease_deadline_ms), None
    deadline = now_ms + lease_timeout_ms
    return FenceDecision(Fence.OK, lease_deadline_ms=deadline), replace(
        state, lease_deadline_ms=deadline
    )


def decide_mark_inbox(state: State | None, token: int) -> tuple[FenceDecision, State | None]:
    """The running body writes its effects through the inbox
    (:mod:`celery_beetle.outbox.inbox`): if it is cut short now, a run after it finds the inbox
    row and returns, so its crash need not use up the message's last attempt
    (:data:`INBOX_EXTRA_STARTS`)."""
    if not _owns(state, token):
        return _not_owner(state), None
    if state.inbox:
        return FenceDecision(Fence.OK), None
    return FenceDecision(Fence.OK), replace(state, inbox=True)


def decide_release(
    state: State | None, token: int, owner: str = ""
) -> tuple[FenceDecision, State | None]:
    """Hand the message back before its body started: the attempt does not count.

    ``token`` 0 with an ``owner``: a claim whose reply never came (so its token is not
    known) is released by the owner that sent it."""
    by_owner = (
        token == 0
        and bool(owner)
        and state is not None
        and state.status is Status.RUNNING
        and state.owner == owner
    )
    if not by_owner and not _owns(state, token):
        return _not_owner(state), None
    assert state is not None
    # a reservation counted no attempt; a start released before its body ran gives it back
    attempts = state.attempts if state.reserved else max(state.attempts - 1, 0)
    pending = replace(_settled(state, Status.PENDING), attempts=attempts, reserved=False)
    return FenceDecision(Fence.OK), pending


def decide_reject(
    state: State | None, facts: MessageFacts, reason: str, owner: str, now_ms: int
) -> tuple[RejectDecision, State | None]:
    """Bad input (an unknown task, a body that does not decode): fail the message without a
    run. The first copy to ask dead-letters it (FIRST; the dead letter is owed by ``owner``
    until it calls ``dead_lettered``); a copy of a settled message is only acked (DONE);
    a copy that finds another owner's live lease (a dead letter being published, or a run)
    is handed back until it ends (WAIT). The same owner asking again gets FIRST again."""
    if state is not None and state.settled:
        return RejectDecision(Rejected.DONE), None
    live = (
        state is not None
        and state.status in (Status.RUNNING, Status.FAILED)
        and state.lease_deadline_ms > now_ms
        and state.owner != owner
    )
    if live:
        assert state is not None
        return RejectDecision(Rejected.WAIT, state.lease_deadline_ms - now_ms), None
    base = state or State(Status.FAILED)
    failed = _owing(replace(base, expires_at_ms=facts.expires_at_ms), reason, owner, now_ms)
    return RejectDecision(Rejected.FIRST), failed


def decide_dead_lettered(state: State | None) -> tuple[bool, State | None]:
    """The dead letter of a failed message is stored: the record becomes final. False (and
    no write) when nothing was owed: marked already, or the record is gone. The record is
    then kept as long as its dead letter may wait in ``<queue>.dead``
    (:func:`dead_lettered_ttl_ms`), so that a replay finds it there and may run it."""
    if state is None or state.status is not Status.FAILED or not state.dead_letter_owed:
        return False, None
    return True, replace(
        state, dead_letter_owed=False, owner="", lease_deadline_ms=0, retry_not_before_ms=0
    )


#: How long the record of a message given up (its dead letter stored) is kept at least, and a
#: replay mark: as long as a dead letter is expected to wait in ``<queue>.dead`` for a person
#: (``beetle_dead_letter_retention``, 30 days). One small hash per dead letter.
DEAD_LETTER_RETENTION_MS = 30 * 86_400_000


def dead_lettered_ttl_ms(state: State, now_ms: int, margin_ms: int, retention_ms: int) -> int:
    """How long Redis keeps a record whose dead letter is stored: past the message's expiry
    and for ``retention_ms`` at least, plus the margin. A replay proves from this record
    that the message failed and never completed (:func:`decide_replay`)."""
    return max(state.expires_at_ms - now_ms, retention_ms, 0) + margin_ms


def decide_replay(
    state: State | None,
    mark: str | None,
    replay_id: str,
    window_end_ms: int,
    now_ms: int,
    force: bool = False,
) -> Replay:
    """Replay the dead letter ``replay_id`` of a message whose record is ``state``?

    ``mark`` is the message's replay mark (:class:`ReplayMark`): a replay writes
    ``r:<replay_id>:<expiry>`` when it resets the record, and ``p:...`` once its publish is
    confirmed. The mark, not the record, says whether *this* dead letter was replayed: the
    record is reset by the replay and rewritten by the run it causes. So a second replay of
    one dead letter (after the first one was interrupted, or at once from another terminal)
    publishes again at most, with the expiry of the first publish, and the store drops the
    extra copies as duplicates of the first; it never resets the record a second time.

    Nothing runs a message that may have completed. A completed record is never reset (a
    broker may dead-letter one copy, a TTL or a delivery limit, while its twin completes);
    a failed one whose dead letter is stored is (it is kept as long as dead letters are:
    :func:`dead_lettered_ttl_ms`). Without a record, only the clock can prove that no copy
    ran: a run's record lives until its message's expiry plus a margin, so before
    ``window_end_ms`` (the dead letter's message's expiry; 0: unknown) no copy was ever
    claimed, and RUN. A copy another dead letter's replay published that is still within
    its window has not run yet either: it is on its way (IN_FLIGHT). Past the window the
    record of a completed run may have expired: REFUSED, unless ``force``. The same holds
    for this dead letter's own replay, resumed after its copy's window: it may have run.
    """
    marked = ReplayMark.parse(mark)
    if marked is not None and marked.replay_id == replay_id:
        if marked.published:
            return Replay.DONE
        if state is not None or now_ms < marked.expires_at_ms or force:
            return Replay.REPUBLISH
        return Replay.REFUSED
    if state is not None:
        if state.status is Status.COMPLETED:
            return Replay.COMPLETED
        if state.status is Status.FAILED and not state.dead_letter_owed:
            return Replay.RUN
        return Replay.IN_FLIGHT
    if marked is not None and now_ms < marked.expires_at_ms:
        return Replay.IN_FLIGHT  # another dead letter's replay published a copy, not yet run
    unclaimed = marked is None and now_ms < window_end_ms
    return Replay.RUN if unclaimed or force else Replay.REFUSED


def replay_mark_ttl_ms(
    mark_ttl_ms: int, window_end_ms: int, expires_at_ms: int, now_ms: int, margin_ms: int
) -> int:
    """How long a replay mark is kept: ``mark_ttl_ms``, and past the dead letter's own
    window and the replayed copy's, so that a mark never ends while the clock alone would
    let a replay of the same dead letter run again."""
    return max(mark_ttl_ms, max(window_end_ms, expires_at_ms) - now_ms + margin_ms)


def key_ttl_ms(state: State, now_ms: int, margin_ms: int) -> int:
    """How long Redis keeps a record after a write: past the message's expiry, its lease
    and its retry time, plus a margin for clock skew between workers. No GC daemon needed."""
    horizon = max(state.expires_at_ms, state.lease_deadline_ms, state.retry_not_before_ms)
    return max(horizon - now_ms, 0) + margin_ms


def _owns(state: State | None, token: int) -> TypeGuard[State]:
    """The fencing check shared by every owner's write: the record must be running under
    exactly this token, so a worker whose lease was taken over cannot write."""
    return state is not None and state.status is Status.RUNNING and state.token == token


def _not_owner(state: State | None) -> FenceDecision:
    if state is None:
        return FenceDecision(Fence.NOT_OWNER)
    return FenceDecision(Fence.NOT_OWNER, status=state.status, token=state.token)


def _settled(state: State, status: Status) -> State:
    """The record without a lease: what the owner-only fields look like off the clock."""
    return replace(
        state,
        status=status,
        lease_deadline_ms=0,
        retry_not_before_ms=0,
        owner="",
        reserved=False,
        inbox=False,
    )
