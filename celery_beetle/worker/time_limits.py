"""Prefork's time limits count from the stored start, so a wait on the store is not the body's.

Celery's prefork pool starts a job's soft and hard time limits in the worker's main process
as soon as a pool process takes the job (billiard's ``ACK``), before the task runs. A
BeetleTask's run then stores its start in Redis before the body begins; a slow or held
reply there came out of the body's time (a 4 s lease gives a 3 s soft limit: a 2 s body
that waited 1.1 s on Redis was stopped at 1.9 s, ``SoftTimeLimitExceeded``).

Here the limits count from the stored start instead, and the lease still ends after the
hard limit, so two runs never overlap:

- the pool process notes in a small table, shared with the main process across the fork,
  that it waits on the store (:func:`waiting_on_the_store`), then the moment its limits
  count from (:func:`limits_count_from`): when the call that set its lease was sent, never
  later, as the lease counts from the store's clock at that call;
- the main process, when a soft or hard limit of a job falls due
  (:func:`count_limits_from_the_start`, installed on the pool), reads that table: while the
  job's process still waits on the store the limit waits too (at most one hard limit
  more), and once the body's limits count from a later moment the limit is moved there.

After the body, the outcome (a completion, a failure) is stored from the same pool process,
retried until Redis takes it. A limit that fell due then would kill the process with a body
that had run to its end and lose its outcome: under a Redis outage shorter than the lease, a
hard limit at 90 % of the lease killed completions the store would have taken in time, and
the next copy found a run started and never completed (a Sentinel failover with
``beetle_redis_wait_replicas``, say). So the process notes that it waits
on the store again (:func:`storing_the_outcome`), and its limits wait as they do before the
body, at most one hard limit more. A body can no longer overrun its lease then; a completion
stored after the lease ran out is refused if another copy took the message over meanwhile.

The table holds two monotonic times per pool process (by billiard's process index):
``waiting`` (the store wait began) and ``counts_from``. A job reads only what was written
after the job's own ``ACK`` (``_time_accepted``, the pool process's monotonic clock, which
is the machine's), so a plain task after a BeetleTask in the same process keeps Celery's
limits as they are. Where the table cannot be read (a custom pool, more processes than
slots), the limits are Celery's.
"""

from __future__ import annotations

import logging
import mmap
import struct
import time
from typing import Any

from billiard.process import current_process
from celery.exceptions import Reject

from celery_beetle import metrics
from celery_beetle.store import Store
from celery_beetle.store.health import STORE_ERRORS
from celery_beetle.store.outcome import Limits
from celery_beetle.store.state import MessageFacts

__all__ = [
    "SLOW_REPLY_S",
    "count_limits_from_the_start",
    "lease_for_the_body",
    "limits_count_from",
    "still_to_wait",
    "storing_the_outcome",
    "waiting_on_the_store",
]

logger = logging.getLogger(__name__)

#: pool processes the table has room for (billiard's process index); 16 bytes each
SLOTS = 4096
_SLOT = struct.Struct("=dd")  # waiting, counts_from (monotonic seconds; 0: not set)

#: Shared with every pool process forked after this module is imported (the worker's main
#: process imports it with ``celery_beetle``, before its pool starts): an anonymous mapping
#: is ``MAP_SHARED``, so a pool process's writes are the main process's reads.
_table = mmap.mmap(-1, SLOTS * _SLOT.size)

#: a limit moved by less than this fires as it is (the timer's own slack)
_SLACK_S = 0.01

#: A claim or start whose reply took longer than this (seconds) renews its lease before the
#: body: the store held the reply while the lease ran.
SLOW_REPLY_S = 0.1


def _own_slot() -> int | None:
    index = getattr(current_process(), "index", None)
    if isinstance(index, int) and 0 <= index < SLOTS:
        return index
    return None


def waiting_on_the_store(now: float | None = None) -> None:
    """In a pool process: this job's body waits on the store from ``now`` (monotonic)."""
    slot = _own_slot()
    if slot is not None:
        _SLOT.pack_into(_table, slot * _SLOT.size, now or time.monotonic(), 0.0)


def storing_the_outcome() -> None:
    """In a pool process: the body has ended and its outcome waits on the store from now on;
    the job's limits wait for it until the job ends (at most one hard limit more), as they
    do for the start before the body."""
    waiting_on_the_store()


def limits_count_from(moment: float) -> None:
    """In a pool process: this job's time limits count from ``moment`` (monotonic), the
    sending of the call that set the lease the body runs on."""
    slot = _own_slot()
    if slot is not None:
        waiting, _ = _SLOT.unpack_from(_table, slot * _SLOT.size)
        _SLOT.pack_into(_table, slot * _SLOT.size, waiting or moment, moment)


def lease_for_the_body(
    store: Store, facts: MessageFacts, token: int, limits: Limits, sent: float, name: str
) -> tuple[float, int | None]:
    """In a pool process, once the claim or start that set the lease answered: (when the
    body's limits count from, the renewed lease deadline or None).

    They count from ``sent``, the sending of that call, as the lease does. A reply slower
    than :data:`SLOW_REPLY_S` used up part of the lease before the body could begin: the
    lease is renewed once (fenced by ``token``) and the limits count from the renewal. A
    lease taken over meanwhile hands the copy back (``Reject``); a store that fails again
    leaves the body what is left of the lease."""
    if time.monotonic() - sent <= SLOW_REPLY_S:
        return sent, None
    renewing = time.monotonic()
    try:
        fence = store.extend(facts, token, limits.lease_timeout_ms)
    except STORE_ERRORS as exc:
        logger.warning(
            "beetle: %s: the lease could not be renewed after a slow store (%r); the body "
            "runs on what is left of it",
            name,
            exc,
        )
        return sent, None
    if not fence.ok:
        metrics.lease_lost("pool")
        logger.warning(
            "beetle: %s: its lease was taken over while the store held the reply (stored "
            "status %s); handing the copy back",
            name,
            fence.status.value if fence.status else None,
        )
        raise Reject("lease taken over before the body began", requeue=True)
    return renewing, fence.lease_deadline_ms


def read_slot(index: int) -> tuple[float, float]:
    """(waiting, counts_from) of pool process ``index``: (0, 0) when out of the table."""
    if not 0 <= index < SLOTS:
        return 0.0, 0.0
    waiting, counts_from = _SLOT.unpack_from(_table, index * _SLOT.size)
    return waiting, counts_from


def still_to_wait(
    accepted: float, slot: tuple[float, float], limit_s: float, hard_s: float, now: float
) -> float:
    """Seconds a time limit of ``limit_s`` that falls due ``now`` must still wait, for a job
    its pool process took at ``accepted`` and whose table slot is ``slot``; 0: fire now.

    - nothing noted since the job was taken (a plain task, a pool process in the main
      process): Celery's limit stands;
    - the limits count from a noted moment: the limit falls due ``limit_s`` after it, or at
      Celery's own time if that moment came before the job was taken (the gate's claim for
      a free process: a limit can be put off here, not brought forward);
    - the body still waits on the store: check again soon, for at most ``hard_s`` past the
      limit's due time (a wait that long is not the store's: the limit fires).
    """
    waiting, counts_from = slot
    if waiting < accepted:
        return 0.0
    if counts_from:
        later = counts_from + limit_s - now
        return later if later > _SLACK_S else 0.0
    if now - waiting >= limit_s + hard_s:
        return 0.0
    return min(0.1, limit_s)


def count_limits_from_the_start(task_pool: Any, hub: Any) -> bool:
    """In the worker's main process: make a prefork pool's time limits wait for the stored
    start (see the module docstring); ``hub`` is the worker's event loop, which runs the
    timers. True if installed (now or before); False for a pool without Celery's
    asynchronous time-limit handlers (solo, threads, a custom pool)."""
    pool = getattr(task_pool, "_pool", None)
    if (
        pool is None
        or hub is None
        or not all(
            hasattr(pool, name)
            for name in ("_on_soft_timeout", "_on_hard_timeout", "_process_by_pid", "_cache")
        )
    ):
        return False
    if getattr(pool, "_beetle_limits_from_start", False):
        return True
    on_soft, on_hard = pool._on_soft_timeout, pool._on_hard_timeout

    def later(job: Any, limit_s: float | None) -> float:
        result = pool._cache.get(job)
        accepted = getattr(result, "_time_accepted", None)
        if result is None or not limit_s or not accepted:
            return 0.0
        process, _ = pool._process_by_pid(getattr(result, "_worker_pid", None))
        index = getattr(process, "index", None)
        if not isinstance(index, int):
            return 0.0
        hard_s = float(getattr(result, "_timeout", None) or limit_s)
        return still_to_wait(accepted, read_slot(index), limit_s, hard_s, time.monotonic())

    def soft_timeout(job: Any, soft: float, hard: float, hub: Any) -> None:
        wait = later(job, soft)
        if wait:
            pool._tref_for_id[job] = hub.call_later(wait, soft_timeout, job, soft, hard, hub)
            return
        on_soft(job, soft, hard, hub)

    def hard_timeout(job: Any) -> None:
        result = pool._cache.get(job)
        wait = later(job, getattr(result, "_timeout", None))
        if wait:
            pool._tref_for_id[job] = hub.call_later(wait, hard_timeout, job)
            return
        on_hard(job)

    pool._on_soft_timeout = soft_timeout
    pool._on_hard_timeout = hard_timeout
    pool._beetle_limits_from_start = True
    return True
