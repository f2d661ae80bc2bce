"""How the gate writes its trace events and settles a copy: one writer, one ack rule.

:class:`GateTrace` writes every event the gate writes, from a delivery, a held twin or a
finished run.

:class:`Settle` applies the rule for acks: with tracing on and pipelined calls, a copy
settled while a batch of Redis replies is handled is acked after the batch, once the
batch's outcome events are written. A worker killed in between then never leaves a trace
that reads "lost". Otherwise the ack is made at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from celery_beetle.worker.handback import ack

__all__ = ["GateTrace", "Settle"]

logger = logging.getLogger(__name__)


class GateTrace:
    """The gate's trace events; nothing is built when tracing is off."""

    __slots__ = ("enabled", "tracer", "worker")

    def __init__(self, tracer: Any, worker: str | None) -> None:
        self.tracer = tracer
        self.worker = worker
        self.enabled = bool(getattr(tracer, "enabled", False))

    def write(
        self,
        event: str,
        message_id: str,
        scope: str,
        message: Any,
        task_name: str | None = None,
        detail: dict[str, Any] | None = None,
        attempt: int = 0,
        pid: int | None = None,
    ) -> None:
        """Write ``event`` (a :class:`~.verdict.Verdict` or another event's name) for
        ``message``; ``task_name`` defaults to its ``task`` header."""
        if not self.enabled:
            return
        info = message.delivery_info or {}
        headers = message.headers or {}
        self.tracer.emit(
            str(event),
            message_id,
            queue=scope,
            task_name=headers.get("task") if task_name is None else task_name,
            task_id=headers.get("id"),
            broker=info.get("beetle_broker"),
            worker=self.worker,
            pid=pid,
            attempt=attempt or None,
            detail=detail,
        )

    def delivered(self, message_id: str, scope: str, task_name: str, message: Any) -> None:
        """Write the ``delivered`` event of a copy as it arrives."""
        if self.enabled:
            info = message.delivery_info or {}
            detail = {"redelivered": bool(info.get("redelivered"))}
            self.write("delivered", message_id, scope, message, task_name, detail)


class Settle:
    """Ack now, or after the batch's outcome events are written.

    - ``tracer``: the gate's tracer (``flush_owed()`` writes a batch's events).
    - ``reads``: the pipelined reads (``in_batch`` is True while their replies are handled);
      None when the gate reads synchronously, and every ack is made at once.
    """

    def __init__(self, tracer: Any, reads: Any) -> None:
        self.tracer = tracer
        self.reads = reads
        self.after_trace = reads is not None and bool(getattr(tracer, "enabled", False))
        self._owed: list[Callable[[], None]] = []

    def __call__(self, ack: Callable[[], None]) -> None:
        """Make ``ack`` now, or once this batch's events are written."""
        if self.after_trace and self.reads.in_batch:
            self._owed.append(ack)
        else:
            ack()

    def ack(self, message: Any) -> None:
        """Ack ``message`` now, or once this batch's events are written; an ack that fails
        is lost with its broker, which delivers the copy again."""
        if self.after_trace and self.reads.in_batch:
            self._owed.append(partial(ack, message))
        else:
            ack(message)

    def after_batch(self) -> None:
        """After a batch of Redis replies: write its outcome events, then make its acks."""
        self.tracer.flush_owed()
        acks, self._owed = self._owed, []
        for make_ack in acks:
            try:
                make_ack()
            except Exception:  # the connection went: the copy comes back, a duplicate
                logger.exception("beetle: cannot ack a completed message")
