"""What a pool process keeps about its runs, between a run and Celery's signals about it.

==============================  =============================================================
``running``                     the run whose body is on this thread now (:func:`mark_inbox`)
``left_to_main``                runs whose body succeeded on the gate's lease: a failure
                                Celery reports after the body completes them here after all
``completed_here_on_the_loop``  runs on the event loop that stored their own completion:
                                the main process's ack must not store it a second time
``running.owed``                the run on this thread whose body returned and whose
                                completion waits until Celery sent its callbacks and the
                                next link of its chain (:func:`owe_completion`)
``refused_here``                runs of this process whose owed completion was refused (the
                                lease taken over): the ack must not call them completed
==============================  =============================================================

As a task ends, before its delivery is acked, the ``published`` events of what it sent are
written (:func:`kombu_beetle.trace.flush_role`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol

from billiard.process import current_process
from celery.signals import task_failure, task_internal_error, task_postrun

from kombu_beetle.trace import flush_role

__all__ = [
    "LeftToMain",
    "OwesCompletion",
    "completed_on_the_loop",
    "leave_to_main",
    "left_to_main",
    "mark_inbox",
    "on_the_event_loop",
    "owe_completion",
    "refused_completion",
    "running",
]


class OwesCompletion(Protocol):
    """A run whose body returned and that stores its completion after Celery's success
    (:class:`~.run.Run`)."""

    request: Any

    def complete_owed(self) -> None: ...


class LeftToMain(Protocol):
    """A run whose completion the main process stores (:class:`~.run.Run`)."""

    request: Any

    def complete_here(self) -> None: ...


#: Runs whose body succeeded on the gate's lease, by task id, until Celery reports the run:
#: a failure Celery reports after the body completes them here. Bounded:
#: a successful run is never looked up again.
left_to_main: OrderedDict[str, LeftToMain] = OrderedDict()
LEFT_TO_MAIN_MAX = 256


def leave_to_main(run: LeftToMain) -> None:
    left_to_main[run.request.id] = run
    while len(left_to_main) > LEFT_TO_MAIN_MAX:
        left_to_main.popitem(last=False)


def _completed_after_all(sender: Any = None, task_id: Any = None, **kwargs: Any) -> None:
    """``task_failure`` / ``task_internal_error`` in the pool after a body succeeded."""
    run = left_to_main.pop(task_id, None) if task_id else None
    if run is not None:
        run.complete_here()


task_failure.connect(_completed_after_all, weak=False)
task_internal_error.connect(_completed_after_all, weak=False)


def _publishes_written(**_: Any) -> None:
    """As a task ends, before its delivery is acked: the ``published`` events of what it
    sent (a chain's next link) are written, so a worker killed after the ack leaves the
    audit the publish of a message that then runs (:func:`kombu_beetle.trace.flush_role`)."""
    flush_role("publisher")


task_postrun.connect(_publishes_written, weak=False)

#: The run whose body is on this thread now (the threads pool runs several at once).
running = threading.local()

#: task ids whose owed completion was refused in this process (:func:`refused_completion`)
refused_here: set[str] = set()


def owe_completion(run: OwesCompletion) -> None:
    """The body of ``run`` returned on this thread: its completion is stored as the task
    ends, once Celery sent its callbacks and the next link of its chain and stored its
    result (``task_postrun``), before its delivery is acked. A worker killed in between
    leaves the message unfinished: another copy takes it over (within ``attempts``) and
    sends the next link again under the same message id, which runs once."""
    stale = getattr(running, "owed", None)
    running.owed = run
    if stale is not None:  # a task ended without its postrun: never leave one unstored
        stale.complete_owed()


def _owed_completion_stored(**_: Any) -> None:
    """``task_postrun``: store the completion the run on this thread owes, if any."""
    run = getattr(running, "owed", None)
    if run is not None:
        running.owed = None
        run.complete_owed()


task_postrun.connect(_owed_completion_stored, weak=False)


def refused_completion(task_id: str) -> bool:
    """True (once) if the owed completion of ``task_id``'s run in this process was refused:
    another run took the message over, so its ack must not tell the gate it completed."""
    try:
        refused_here.remove(task_id)
    except KeyError:
        return False
    return True


#: task ids whose run on the worker's event loop stored its own completion: the main
#: process's ack must not store (and trace) it a second time (:func:`completed_on_the_loop`)
completed_here_on_the_loop: set[str] = set()


def completed_on_the_loop(task_id: str) -> bool:
    """True (once) if the run of ``task_id`` on the event loop stored its completion."""
    try:
        completed_here_on_the_loop.remove(task_id)
    except KeyError:
        return False
    return True


def on_the_event_loop() -> bool:
    """The body runs where the worker's event loop does (solo, gevent, eventlet): the main
    thread of the main process. A threads pool's bodies run beside the loop."""
    return (
        current_process().name == "MainProcess"
        and threading.current_thread() is threading.main_thread()
    )


def mark_inbox(request: Any) -> bool:
    """Tell the store that the body running for ``request`` commits its effects through the
    inbox (:func:`celery_beetle.outbox.inbox.once`), so that a crash right after its commit
    does not use up the message's last attempt: the next run finds the row and returns
    (:data:`~celery_beetle.store.outcome.INBOX_EXTRA_STARTS`). True if stored; a store that does
    not answer within a few seconds costs only that allowance (logged), never the body."""
    run = getattr(running, "run", None)
    if run is None or run.request.id != getattr(request, "id", None) or not run.lease.token:
        return False
    return run.mark_inbox()
