"""A run's calls to the store before its body: retried under its owner, then handed back.

A call retried under the same owner after a lost reply gets this run's lease back, not a
second attempt.
The retries last :data:`CLAIM_RETRY_S`, but under prefork at most a tenth of the soft time
limit (:func:`retry_window`), unless Celery acked the copy early (``acks_late`` off).
Back in the gate, a handed-back delivery waits for Redis without holding a pool slot.
The wait is not taken from the body's time limits, which count from the stored start
(:mod:`.time_limits`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from billiard.process import current_process

from celery_beetle.store.health import store_unavailable
from celery_beetle.worker.errors import HandBack

__all__ = ["CLAIM_RETRY_S", "RetriedCalls", "retry_window"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How long a claim is retried (same owner) before the delivery is handed back.
CLAIM_RETRY_S = 3.0


def retry_window(task: Any, request: Any) -> float:
    """How long the pool retries the store before handing the delivery back."""
    # solo, threads, gevent: no time limits, a lease keeper. With acks_late off, Celery
    # acked the copy as the pool took it: a claim whose reply was lost is found again by a
    # retry under the same owner, where a copy sent back would wait out the lease and count
    # a second attempt
    if current_process().name == "MainProcess" or not getattr(task, "acks_late", True):
        return CLAIM_RETRY_S
    timelimit = getattr(request, "timelimit", None) or (None, None)
    limits = [getattr(task, "soft_time_limit", None), timelimit[1]]
    soft = min((float(limit) for limit in limits if limit), default=0.0)
    return min(CLAIM_RETRY_S, soft / 10) if soft else CLAIM_RETRY_S


class RetriedCalls:
    """The calls of one run (``task``, ``request``), named ``name`` in the logs."""

    def __init__(self, task: Any, request: Any, name: str) -> None:
        self.task = task
        self.request = request
        self.name = name
        #: when the last call was sent (monotonic): a lease counts from it
        self.sent = time.monotonic()

    def __call__(self, call: Callable[[], _T], what: str, owner: str) -> _T:
        """``call`` (a claim, a start, an inbox mark), retried under ``owner``; then the
        delivery is handed back (:class:`~.errors.HandBack`)."""
        deadline = time.monotonic() + retry_window(self.task, self.request)
        wait = 0.1
        while True:
            self.sent = time.monotonic()
            try:
                return call()
            except Exception as exc:
                unavailable = store_unavailable(exc)
                if time.monotonic() + wait > deadline:
                    self._giving_up(what, exc, unavailable)
                    raise HandBack(f"{what} not stored: {exc!r}", 2.0, unavailable, owner) from exc
                time.sleep(wait)
                wait = min(wait * 2, 1.0)

    def _giving_up(self, what: str, exc: Exception, unavailable: bool) -> None:
        if unavailable:  # the gate says the outage, once, as it pauses
            logger.debug("beetle: cannot %s %s (%r); handing it back", what, self.name, exc)
        else:
            logger.exception("beetle: the %s of %s failed; handing it back", what, self.name)
