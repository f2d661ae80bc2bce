"""Quorum queues under a beetle worker: what Celery does for them, and what we turn off.

* Prefetch: quorum queues refuse a channel-wide (global) prefetch. The transport applies
  Celery's count per consumer on a channel that consumes a queue it cannot vouch is classic
  (a quorum queue, or one migrated before every config says so), and a change of the count
  by consuming again under a fresh tag (:mod:`kombu_beetle.prefetch`), whatever Celery's
  ``global`` flag says.
* Celery >= 5.5's *native delayed delivery* (a bootstep that declares ``celery_delayed_*``
  exchanges on each broker URL when the config names a quorum queue) cannot parse a
  multi-broker ``beetle://`` URL and stops the worker at startup. BeetleTask does not need
  it (its retries wait in delay queues, :mod:`celery_beetle.worker.retry_queue`), so for beetle
  apps the step is left out. Countdown and ETA tasks on quorum queues then behave as on
  Celery < 5.5: held by the worker (keep their exchange ``direct``, Celery's default,
  which is never rerouted through the missing ``celery_delayed_*`` exchanges).
* Redeliveries: a quorum queue counts them (``x-delivery-count``) against its
  ``delivery-limit`` (a policy, :mod:`celery_beetle.ops.policies`); hand-backs count it
  too (:mod:`celery_beetle.worker.handback`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["leave_out_native_delayed_delivery"]


def leave_out_native_delayed_delivery() -> None:
    """Make Celery's DelayedDelivery bootstep skip apps whose broker is ``beetle://``
    (once per process; a no-op on Celery versions without it)."""
    try:
        from celery.worker.consumer.delayed_delivery import DelayedDelivery
    except ImportError:  # Celery < 5.5
        return
    if getattr(DelayedDelivery, "_beetle_left_out", False):
        return
    original = DelayedDelivery.include_if

    def include_if(self: Any, c: Any) -> bool:
        if str(c.app.conf.get("broker_url") or "").startswith("beetle://"):
            return False
        return bool(original(self, c))

    DelayedDelivery.include_if = include_if
    DelayedDelivery._beetle_left_out = True
