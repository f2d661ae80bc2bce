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
==========================  ==================================================================

Raised by :class:`~.run.Run`; the two the pool sends to the main process pickle their own
arguments. A result or a pickle that names one by an older module path
(``celery_beetle.run``) still finds it (:mod:`celery_beetle._moved`).
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Ignore, Reject

__all__ = ["AttemptsExhausted", "DeadLettered", "Dropped", "HandBack"]


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
