"""The exceptions a run raises: what it tells the result backend, Celery and the gate.

==========================  ==================================================================
:class:`DeadLettered`       the message gave up and is in ``<queue>.dead``; the result
                            backend records the failure (``celery_beetle`` exports it)
:class:`AttemptsExhausted`  the same, because it started ``attempts`` times
:class:`Dropped`            this copy is not run (a duplicate, or expired): Celery's
                            ``Ignore``, acked without a result
:class:`HandBack`           give the delivery back for the gate to requeue after a backoff:
                            Celery's ``Reject(requeue=True)``, raised in the pool and read in
                            the main process (:class:`~celery_beetle.task.BeetleRequest`)
:class:`Deferred`           not now: another run holds the message's lease, or its retry is
                            not due; Celery's ``Reject(requeue=True)``, and the gate defers
                            the copy redelivered
==========================  ==================================================================

Celery logs every ``Reject`` at WARNING with its traceback. A hand-back or a deferral is
expected (Redis away, a twin running elsewhere), so :func:`quiet_expected_rejects` moves
Celery's line for these two to DEBUG; the condition behind them is said once, by the gate.

Raised by :class:`~.run.Run`; the two the pool sends to the main process pickle their own
arguments. A result or a pickle that names one by an older module path
(``celery_beetle.run``) still finds it (:mod:`celery_beetle._moved`).
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import Ignore, Reject

__all__ = [
    "AttemptsExhausted",
    "DeadLettered",
    "Deferred",
    "Dropped",
    "HandBack",
    "quiet_expected_rejects",
]

logger = logging.getLogger(__name__)

#: the logger Celery's task tracer reports a run's ``Reject`` on
CELERY_TRACE_LOGGER = "celery.app.trace"


class DeadLettered(Exception):
    """The message gave up without this run (its dead letter was owed by a run that could
    not publish it); it is dead-lettered now. The result backend records the failure."""


class AttemptsExhausted(DeadLettered):
    """The message started ``attempts`` times (crashed runs included) and never completed;
    it was dead-lettered. The result backend records this as the task's failure."""


class Dropped(Ignore):
    """This copy is not run: another copy ran (``duplicate``) or the message ``expired``.

    Acked without a result, as ``Ignore`` is; the main process sends Celery's monitors a
    ``task-beetle-dropped`` event for it (:class:`~celery_beetle.task.BeetleRequest`), so the
    ``task-received``/``task-started`` Celery already sent for this copy are not taken for a
    second run."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __reduce__(self) -> Any:
        return (type(self), (self.reason,))


class HandBack(Reject):
    """Give the delivery back, unacked, for the gate to requeue after ``delay_s``.

    ``store``: the store was unavailable (the gate pauses until it answers); ``owner``: a
    claim sent under this owner may have been applied without its reply arriving (the gate
    releases it by its owner once Redis answers). Raised in the pool, read in the main
    process (:class:`~celery_beetle.task.BeetleRequest`), so it pickles its own arguments.
    """

    def __init__(
        self, reason: str, delay_s: float = 1.0, store: bool = False, owner: str = ""
    ) -> None:
        super().__init__(reason, requeue=True)
        self.delay_s = delay_s
        self.store = store
        self.owner = owner

    def __reduce__(self) -> Any:
        return (type(self), (self.reason, self.delay_s, self.store, self.owner))

    def mark(self) -> dict[str, Any]:
        return {
            "reason": str(self.reason)[:300],
            "delay_s": self.delay_s,
            "store": self.store,
            "owner": self.owner,
        }


class Deferred(Reject):
    """This copy does not run now: another run holds the message's lease, or its retry is
    not due. Celery's ``Reject(requeue=True)``; the gate defers the copy redelivered."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, requeue=True)

    def __reduce__(self) -> Any:
        return (type(self), (self.reason,))


class _ExpectedRejectsAtDebug(logging.Filter):
    """Celery's line for a :class:`HandBack` or :class:`Deferred`, logged here at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback
        if not isinstance(exc, (HandBack, Deferred)):
            return True
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("beetle: %s", record.getMessage(), exc_info=record.exc_info)
        return False


def quiet_expected_rejects() -> None:
    """Install :class:`_ExpectedRejectsAtDebug` on Celery's tracer logger, once per process
    (at this module's import: every process that runs a BeetleTask imports it)."""
    trace_logger = logging.getLogger(CELERY_TRACE_LOGGER)
    if not any(isinstance(f, _ExpectedRejectsAtDebug) for f in trace_logger.filters):
        trace_logger.addFilter(_ExpectedRejectsAtDebug())


quiet_expected_rejects()
