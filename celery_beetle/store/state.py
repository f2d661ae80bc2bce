"""The dedup record of one message, and the facts a delivery brings with it.

One record per ``(scope, message_id)``, held by the store (one Redis hash; a dict in the
fake). The scope is the logical queue (:mod:`kombu_beetle.scopes`): by default the name of
the queue the message was consumed from; several physical queues may share one. The record's
key is :func:`celery_beetle.store.keys.record_key`. It lives apart from
:mod:`celery_beetle.store.outcome` so the decision rules read on their own and the store modules
share one description of the fields.

Redis field names are one letter, because Redis keeps a small hash as a listpack whose size
is the sum of its field names and values: short names keep an in-flight message under
300 bytes (see ``benchmarks/bench_store.py``).

======  ==========================  =============================================
field   attribute                   meaning
======  ==========================  =============================================
``s``   ``status``                  ``p`` pending, ``r`` running, ``c`` completed,
                                    ``f`` failed
``a``   ``attempts``                body starts so far (a reservation is not one)
``e``   ``exceptions``              failures reported so far
``l``   ``lease_deadline_ms``       while running: the owner's lease ends here
``n``   ``retry_not_before_ms``     while pending: no claim before this time
``o``   ``owner``                   who holds (or last held) the lease
``t``   ``token``                   fencing token, +1 on every claim
``x``   ``expires_at_ms``           the message's own expiry (``x-beetle-expires-at``)
``w``   ``dead_letter_owed``        failed, and its dead letter is not stored yet:
                                    ``o`` publishes it until ``l``, then anyone may
``r``   ``reason``                  why it failed (a :class:`~.outcome.GiveUpReason`)
``v``   ``reserved``                running, but the body has not begun: the gate's
                                    claim, held for a delivery that waits for a pool
                                    process. ``l`` is then a short reservation the
                                    gate renews; the pool's start (``start.lua``)
                                    counts the attempt and sets the full lease
``i``   ``inbox``                   the body marked its effects as committed through
                                    the inbox (:mod:`celery_beetle.outbox.inbox`): a
                                    run cut short by a crash may start again, to find
                                    its row, past ``attempts`` (see
                                    :data:`~.outcome.INBOX_EXTRA_STARTS`)
======  ==========================  =============================================

Absent fields read as 0 or ``""``: a completed record drops ``l``, ``n``, ``o`` and ``v``.

``attempts`` counts bodies that began, never claims: a claim whose body never began (its
delivery waited in a pool's queue when the worker was killed) holds only a reservation,
which runs out within seconds (:data:`~.outcome.RESERVATION_MS`) unless the gate that made
it renews it, and then any copy may claim the message again without using an attempt.

A message leaves its queue only once its outcome, or its dead letter, is stored. So a give-up
first writes ``f`` with ``w`` (the dead letter is owed), the worker publishes the dead letter,
then clears ``w``. A copy that finds ``w`` set waits while ``o`` holds the lease ``l`` and
takes the dead letter over after it: the message is never acked with no dead letter anywhere.
A ``f`` record without ``w`` (written by an earlier version too) is final.

Values are integers in milliseconds; a value written in floating point (``1e+17``, by an
earlier version given a far-future expiry) still reads, as its integer part.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FIELDS", "MAX_OWNER_LENGTH", "MessageFacts", "State", "Status"]

#: Field order of a peek (HMGET) and of :meth:`State.from_values`.
FIELDS: tuple[str, ...] = ("s", "a", "e", "l", "n", "o", "t", "x", "w", "r", "v", "i")

#: Owners longer than this are cut: Redis turns a hash whose value exceeds
#: ``hash-max-listpack-value`` (64 by default) into a hashtable several times larger.
MAX_OWNER_LENGTH = 48


class Status(str, enum.Enum):
    """Where a message stands; the value is what Redis stores in field ``s``."""

    PENDING = "p"
    RUNNING = "r"
    COMPLETED = "c"
    FAILED = "f"

    @property
    def is_final(self) -> bool:
        """Completed and failed messages never run again (a failed one may still owe its
        dead letter: :attr:`State.settled`)."""
        return self in (Status.COMPLETED, Status.FAILED)


@dataclass(frozen=True)
class MessageFacts:
    """What a delivery tells about its message; the same on every copy of it.

    ``queue`` is the physical queue it was consumed from: where its retries and dead letters
    go. ``scope`` is its dedup scope, the first half of its identity ``(scope, message_id)``:
    the queue's name unless ``beetle_dedup_scopes`` maps the queue to another (left empty,
    it is the queue's name). ``expires_at_ms`` comes from ``x-beetle-expires-at`` (or the
    publish time plus the default message TTL when the header is missing).
    """

    queue: str
    message_id: str
    expires_at_ms: int
    scope: str = ""

    def __post_init__(self) -> None:
        if not self.scope:
            object.__setattr__(self, "scope", self.queue)

    @property
    def identity(self) -> tuple[str, str]:
        """``(scope, message_id)``: what one record, one run and one audit entry stand for."""
        return (self.scope, self.message_id)


@dataclass(frozen=True)
class State:
    """The stored record; see the module docstring for the fields."""

    status: Status
    attempts: int = 0
    exceptions: int = 0
    lease_deadline_ms: int = 0
    retry_not_before_ms: int = 0
    owner: str = ""
    token: int = 0
    expires_at_ms: int = 0
    dead_letter_owed: bool = False
    reason: str = ""
    reserved: bool = False
    inbox: bool = False

    @property
    def settled(self) -> bool:
        """Final with nothing left to store: completed, or failed and dead-lettered. Only
        then is a further copy a plain duplicate to ack."""
        return self.status.is_final and not self.dead_letter_owed

    @classmethod
    def from_values(cls, values: Sequence[str | bytes | None]) -> State | None:
        """Build a record from HMGET values in :data:`FIELDS` order; None if absent."""
        if not values or values[0] is None:
            return None
        text = [v.decode() if isinstance(v, bytes) else v for v in values]
        text += [None] * (len(FIELDS) - len(text))
        s, a, e, lease, n, o, t, x, w, r, v, i = text[: len(FIELDS)]
        return cls(
            status=Status(s),
            attempts=_int(a),
            exceptions=_int(e),
            lease_deadline_ms=_int(lease),
            retry_not_before_ms=_int(n),
            owner=o or "",
            token=_int(t),
            expires_at_ms=_int(x),
            dead_letter_owed=bool(w),
            reason=r or "",
            reserved=bool(v),
            inbox=bool(i),
        )


def _int(value: str | None) -> int:
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        number = float(value)  # "1e+17": Lua's format for a large number
    if number != number:  # nan
        return 0
    return int(max(min(number, 2.0**62), -(2.0**62)))
