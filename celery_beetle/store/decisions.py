"""What the dedup rules take and answer, as data: the limits, and one decision per step.

Each rule of :mod:`.outcome` returns one of these, its outcome named by an enum (beetle's
``r_c.rb`` names every outcome the same way), so that a caller reads what happened from a
value, the in-memory store returns the very values the rules make, and the Redis store
builds them from its scripts' replies (:mod:`.redis`).

===================  ===================  ===========================================
step                 outcome              decision
===================  ===================  ===========================================
the gate's read      :class:`Gate`        :class:`GateDecision`
a claim              :class:`Claim`       :class:`ClaimDecision`
an owner's write     :class:`Fence`       :class:`FenceDecision` (start, complete,
                                          extend, release, inbox mark)
a failure            :class:`Failure`     :class:`FailureDecision` (why it gives up:
                                          :class:`GiveUpReason`)
bad input            :class:`Rejected`    :class:`RejectDecision`
a replay             :class:`Replay`      :class:`ReplayDecision` (the message's mark:
                                          :class:`ReplayMark`)
===================  ===================  ===========================================

:class:`Limits` carries a task's limits into the rules and the scripts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from celery_beetle.store.state import Status

__all__ = [
    "REPLAY_PUBLISHED",
    "REPLAY_STARTED",
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
]


@dataclass(frozen=True)
class Limits:
    """Per-task limits in milliseconds, as :class:`~celery_beetle.settings.BeetleSettings`
    derives them; the settings validate, this only carries them into scripts and rules."""

    lease_timeout_ms: int = 300_000
    attempts: int = 1
    exceptions: int = 0
    delay_ms: int = 10_000
    max_delay_ms: int = 600_000


class Gate(enum.Enum):
    """What the main process does with a delivery before it reaches the pool."""

    RUN = "run"
    DROP_DUPLICATE = "drop_duplicate"
    DEFER = "defer"
    DROP_EXPIRED = "drop_expired"


@dataclass(frozen=True)
class GateDecision:
    """``delay_ms``: for DEFER, how long until the other run's lease ends or the retry is due.

    ``status``: the stored status, None when Redis holds nothing (or was not asked).
    """

    outcome: Gate
    delay_ms: int = 0
    status: Status | None = None


class Claim(enum.Enum):
    """Whether the pool may run the body now."""

    ACQUIRED = "acquired"
    ALREADY_DONE = "already_done"
    LOCKED = "locked"
    DELAYED = "delayed"
    DEAD_LETTER = "dead_letter"
    EXPIRED = "expired"


@dataclass(frozen=True)
class ClaimDecision:
    """The claim's result; fields not meaningful for an outcome stay 0, "" or None.

    - ACQUIRED: ``token`` to present to complete/fail/extend, ``attempt`` (1 for the first
      run), ``lease_deadline_ms`` by which the body must be done.
    - ALREADY_DONE: ``status`` completed or failed.
    - LOCKED: ``owner`` and ``lease_deadline_ms`` of the live lease, ``delay_ms`` until it ends.
    - DELAYED: ``delay_ms`` until retry-not-before.
    - DEAD_LETTER: the message will not run; the caller publishes its dead letter for
      ``reason`` (``attempts_limit`` when the runs made, ``attempt``, used up the attempts;
      otherwise the reason of an earlier give-up whose dead letter is still owed) and then
      calls ``dead_lettered``.
    """

    outcome: Claim
    token: int = 0
    attempt: int = 0
    lease_deadline_ms: int = 0
    delay_ms: int = 0
    status: Status | None = None
    owner: str = ""
    reason: str = ""
    exceptions: int = 0
    #: ACQUIRED over another owner's lease that ran out (a worker died or outlived it)
    taken_over: bool = False

    @property
    def acquired(self) -> bool:
        return self.outcome is Claim.ACQUIRED


class Failure(enum.Enum):
    """What happens to a message whose body raised."""

    RETRY = "retry"
    GIVE_UP = "give_up"
    NOT_OWNER = "not_owner"


class GiveUpReason(str, enum.Enum):
    """Why a failed message goes to the dead-letter queue; the value goes into its headers."""

    ATTEMPTS_LIMIT = "attempts_limit"
    EXCEPTIONS_LIMIT = "exceptions_limit"
    NOT_RETRYABLE = "not_retryable"


class Rejected(enum.Enum):
    """What a copy of bad input does (:func:`~.outcome.decide_reject`)."""

    FIRST = "first"  # dead-letter this copy, then call dead_lettered
    DONE = "done"  # settled already: ack this copy, nothing else
    WAIT = "wait"  # another copy's worker is on it (or it runs): hand this one back


@dataclass(frozen=True)
class RejectDecision:
    """``delay_ms``: for WAIT, until the other worker's lease ends."""

    outcome: Rejected
    delay_ms: int = 0


@dataclass(frozen=True)
class FailureDecision:
    """RETRY: ``delay_ms`` and ``retry_not_before_ms``; GIVE_UP: ``reason``.

    ``attempts`` and ``exceptions`` are the counts after this failure (0 for NOT_OWNER).
    """

    outcome: Failure
    delay_ms: int = 0
    retry_not_before_ms: int = 0
    reason: GiveUpReason | None = None
    attempts: int = 0
    exceptions: int = 0


class Replay(enum.Enum):
    """What a replay does with one dead letter (:func:`~.outcome.decide_replay`)."""

    RUN = "run"  # the record is reset (deleted) and marked: publish it, then ack the dead letter
    REPUBLISH = "republish"  # this dead letter's replay began, unconfirmed: publish it again
    DONE = "done"  # this dead letter was replayed and the publish confirmed: only ack it
    COMPLETED = "completed"  # the message completed (its twin did): drop the dead letter
    IN_FLIGHT = "in_flight"  # a copy pending, running or replayed and queued, or a dead letter owed
    REFUSED = "refused"  # nothing proves it did not complete (past the dedup window): leave it


class ReplayDecision(NamedTuple):
    """A store's answer to a replay: ``expires_at_ms``, for RUN and REPUBLISH, is the expiry
    the published copy carries (for REPUBLISH the first publish's, 0 if the mark predates
    it), so that every copy of one replay shares one dedup window."""

    outcome: Replay
    expires_at_ms: int = 0


class Fence(enum.Enum):
    """Whether an owner's write (complete, extend, release) was accepted."""

    OK = "ok"
    NOT_OWNER = "not_owner"


@dataclass(frozen=True)
class FenceDecision:
    """OK, or NOT_OWNER with the stored ``status`` and ``token`` (None/0 if nothing is stored).

    ``lease_deadline_ms``: for an accepted extend or start, the new deadline (for a renewal
    of a reservation whose body has begun: the running lease's, unchanged).
    """

    outcome: Fence
    lease_deadline_ms: int = 0
    status: Status | None = None
    token: int = 0
    #: for a start: the attempt it counted (the body's number, 1 for the first)
    attempt: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome is Fence.OK

    @property
    def record_lost(self) -> bool:
        """Refused with nothing stored: no run holds the message (a failover lost it)."""
        return not self.ok and self.status is None


#: the values of a replay mark: a replay of that dead letter began / its publish was confirmed
REPLAY_STARTED, REPLAY_PUBLISHED = "r:", "p:"


@dataclass(frozen=True)
class ReplayMark:
    """A message's replay mark, ``r:<replay id>:<expires at ms>`` (``p:`` once the publish
    is confirmed): which dead letter a replay began with, and when the copy it publishes
    expires, which ends the dedup window of that copy. Marks written before the expiry was
    recorded (``r:<id>``) read with ``expires_at_ms`` 0: unknown."""

    published: bool
    replay_id: str
    expires_at_ms: int = 0

    @classmethod
    def parse(cls, text: str | None) -> ReplayMark | None:
        if not text or not text.startswith((REPLAY_STARTED, REPLAY_PUBLISHED)):
            return None
        replay_id, _, expires = text[2:].partition(":")
        return cls(
            text.startswith(REPLAY_PUBLISHED), replay_id, int(expires) if expires.isdigit() else 0
        )

    def text(self) -> str:
        kind = REPLAY_PUBLISHED if self.published else REPLAY_STARTED
        return f"{kind}{self.replay_id}:{self.expires_at_ms}"
