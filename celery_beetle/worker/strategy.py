"""A BeetleTask's Celery strategy behind the gate.

Celery hands each task message to the task's *strategy* in the worker's main process.
:class:`GatedStrategy` sends each delivery through the gate first; the gate starts Celery's
strategy only for a delivery it lets run.
A delivery its queue counted often is first replaced by a fresh copy (:mod:`.renewal`).

The strategy's ack and reject tell the run's :class:`~.ending.RunEnding` how it ended.

=================================  =======================================================
Celery calls                       what happens
=================================  =======================================================
ack, on the gate's claim           the gate stores the completion first, then acks
ack                                ack; the run finished
reject with the pool's hand-back   the gate requeues it after a backoff
reject                             reject; the run finished
=================================  =======================================================

Errors Celery's message handler would catch around a strategy call are caught here, as a
deferred delivery starts from a timer, outside that handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from celery.exceptions import InvalidTaskError
from kombu.exceptions import ContentDisallowed, DecodeError

from celery_beetle.worker.deliveries import Ending
from celery_beetle.worker.facts import FACTS_HEADER, HANDBACK_MARK
from celery_beetle.worker.gate import DeliveryGate
from celery_beetle.worker.renewal import DeliveryRenewal

__all__ = ["GatedStrategy"]

logger = logging.getLogger(__name__)


class GatedStrategy:
    """``strategy`` behind ``gate``, in the place of Celery's strategy for ``task_name``.

    - ``consumer``: Celery's consumer (``on_invalid_task``, ``on_decode_error``).
    - ``renewal()``: the renewal of deliveries a quorum queue counted often, or None.
    """

    #: the bootstep gates each strategy once, even when the consumer restarts
    beetle_gated = True

    def __init__(
        self,
        strategy: Any,
        task_name: str,
        gate: DeliveryGate,
        consumer: Any,
        renewal: Callable[[], DeliveryRenewal | None] = lambda: None,
    ) -> None:
        self.__wrapped__ = strategy
        self.task_name = task_name
        self.gate = gate
        self.consumer = consumer
        self.renewal = renewal

    def __call__(
        self, message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any
    ) -> None:
        renewing = self.renewal()
        if renewing is not None and renewing.renewed(message, self.gate.queue_of(message)):
            return
        delivered = _Delivered(self, message, body, ack, reject, callbacks, kwargs)
        self.gate.handle(message, self.task_name, delivered.start)


class _Delivered:
    """One delivery as Celery gave it, until the gate starts it."""

    __slots__ = ("ack", "body", "callbacks", "kwargs", "message", "reject", "strategy")

    def __init__(
        self,
        strategy: GatedStrategy,
        message: Any,
        body: Any,
        ack: Any,
        reject: Any,
        callbacks: Any,
        kwargs: dict[str, Any],
    ) -> None:
        self.strategy = strategy
        self.message = message
        self.body = body
        self.ack = ack
        self.reject = reject
        self.callbacks = callbacks
        self.kwargs = kwargs

    def start(self, ending: Ending) -> None:
        """Hand the delivery to Celery's strategy; never raises."""
        gated, message = self.strategy, self.message
        settling = _Settling(gated.gate, message, self.ack, self.reject, ending)
        try:
            gated.__wrapped__(
                message, self.body, settling.on_ack, settling.on_reject, self.callbacks,
                **self.kwargs,
            )  # fmt: skip
        except (InvalidTaskError, ContentDisallowed) as exc:
            ending.finished()
            gated.consumer.on_invalid_task(self.body, message, exc)
        except DecodeError as exc:
            ending.finished()
            gated.consumer.on_decode_error(message, exc)
        except Exception:
            # Celery's strategy failed on something nobody foresaw: never out of the
            # consumer (it would restart, or the worker exit); the message goes back
            logger.exception("beetle: starting %s failed; handing it back", gated.task_name)
            ending.finished()
            gated.gate.hand_back(message)


class _Settling:
    """The ack and reject Celery's request is given for one started delivery.

    Apart from :class:`_Delivered`: the run's ending holds the gate's delivery, which holds
    ``_Delivered.start``, so keeping the ending there would make a reference cycle.
    """

    __slots__ = ("_ack", "_reject", "ending", "gate", "message")

    def __init__(
        self, gate: DeliveryGate, message: Any, ack: Any, reject: Any, ending: Ending
    ) -> None:
        self.gate = gate
        self.message = message
        self._ack = ack
        self._reject = reject
        self.ending = ending

    def on_ack(self, *args: Any, **kw: Any) -> Any:
        """Celery acks: a run on the gate's claim stores its completion first."""
        acked = partial(self.acked, args, kw)
        if self.gate.complete_before_ack(self.message, acked):
            return None
        return acked()

    def acked(self, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        """Make Celery's ack, now or once the completion is stored; the run finished."""
        try:
            return self._ack(*args, **kw)
        finally:
            self.ending.finished()

    def on_reject(self, *args: Any, **kw: Any) -> Any:
        """Celery rejects: a copy the pool handed back is requeued after a backoff."""
        facts = (self.message.headers or {}).get(FACTS_HEADER)
        mark = facts.pop(HANDBACK_MARK, None) if isinstance(facts, dict) else None
        if isinstance(mark, dict):
            self.ending.handed_back(mark, partial(self._reject, *args, **kw))
            return None
        try:
            return self._reject(*args, **kw)
        finally:
            self.ending.finished()
