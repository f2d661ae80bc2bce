"""What the gate did with a delivery: one :class:`Verdict` per outcome.

A verdict's value is its ``stats`` key, its ``verdict`` metric label and, where the gate
writes one, its trace event. The verdict table of :mod:`.gate` says when each is given.
"""

from __future__ import annotations

import enum

__all__ = ["COUNTED", "Verdict"]


class Verdict(str, enum.Enum):
    """What the gate did with one delivery."""

    RUN = "run"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    DEFERRED = "deferred"
    WAITING = "waiting"
    PARKED = "parked"
    READING = "reading"
    BAD_INPUT = "bad_input"
    UNKNOWN_TASK = "unknown_task"
    HANDED_BACK = "handed_back"
    GIVEN_BACK = "given_back"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


#: the verdicts the ``beetle_gate_deliveries`` metric counts, by label
COUNTED = (
    Verdict.RUN,
    Verdict.DUPLICATE,
    Verdict.DEFERRED,
    Verdict.EXPIRED,
    Verdict.PARKED,
    Verdict.WAITING,
    Verdict.BAD_INPUT,
    Verdict.UNKNOWN_TASK,
    Verdict.HANDED_BACK,
    Verdict.ERROR,
)
