"""A BeetleTask's Celery strategy behind the gate.

Celery hands each task message to the task's *strategy* in the worker's main process.
:class:`GatedStrategy` sends each delivery through the gate first; the gate starts Celery's
strategy only for a delivery it lets run.
A delivery its queue counted often is first replaced by a fresh copy (:mod:`.renewal`).

The strategy's ack and reject tell the run's :class:`~.ending.RunEnding` how it ended.

=================================  =======================================================
Celery calls                       what happens
=================================  =======================================================
ack, on the gate's claim           the gate stores the completion first, then acks (or
                                   requeues, if the store lost the message's record)
ack                                ack; the run finished
reject with the pool's hand-back   the gate requeues it after a backoff
reject                             reject; the run finished
=================================  =======================================================

Errors Celery's message handler would catch around a strategy call are caught here, as a
deferred delivery starts from a timer, outside that handler.

The per-delivery callables are partials of named methods, not closures or objects that hold
the run's ending where the gate's delivery could reach them back: no reference cycles.
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
from kombu_beetle.scopes import home_queue

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
        start = partial(self._start, message, body, ack, reject, callbacks, kwargs)
        self.gate.handle(message, self.task_name, start)

    def _start(
        self,
        message: Any,
        body: Any,
        ack: Any,
        reject: Any,
        callbacks: Any,
        kwargs: dict[str, Any],
        ending: Ending,
    ) -> None:
        """The gate lets the delivery run: hand it to Celery's strategy; never raises."""
        _route_home(message, self.gate.queue_of(message))
        on_ack = partial(self._on_ack, message, ack, reject, ending)
        on_reject = partial(self._on_reject, message, reject, ending)
        try:
            self.__wrapped__(message, body, on_ack, on_reject, callbacks, **kwargs)
        except (InvalidTaskError, ContentDisallowed) as exc:
            ending.finished()
            self.consumer.on_invalid_task(body, message, exc)
        except DecodeError as exc:
            ending.finished()
            self.consumer.on_decode_error(message, exc)
        except Exception:
            # Celery's strategy failed on something nobody foresaw: never out of the
            # consumer (it would restart, or the worker exit); the message goes back
            logger.exception("beetle: starting %s failed; handing it back", self.task_name)
            ending.finished()
            self.gate.hand_back(message)

    def _on_ack(
        self, message: Any, ack: Any, reject: Any, ending: Ending, *args: Any, **kw: Any
    ) -> Any:
        """Celery acks: a run on the gate's claim stores its completion first."""
        acked = partial(self._acked, ack, ending, args, kw)
        requeued = partial(self._requeued, reject, ending, args)
        if self.gate.complete_before_ack(message, acked, requeued):
            return None
        return acked()

    @staticmethod
    def _acked(ack: Any, ending: Ending, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        """Make Celery's ack, now or once the completion is stored; the run finished."""
        try:
            return ack(*args, **kw)
        finally:
            ending.finished()

    @staticmethod
    def _requeued(reject: Any, ending: Ending, args: tuple[Any, ...]) -> Any:
        """Requeue the copy in the place of its ack (Celery's ``reject`` takes the ack's
        ``logger`` and ``errors``); the run finished."""
        try:
            return reject(*args, requeue=True)
        finally:
            ending.finished()

    @staticmethod
    def _on_reject(message: Any, reject: Any, ending: Ending, *args: Any, **kw: Any) -> Any:
        """Celery rejects: a copy the pool handed back is requeued after a backoff."""
        facts = (message.headers or {}).get(FACTS_HEADER)
        mark = facts.pop(HANDBACK_MARK, None) if isinstance(facts, dict) else None
        if isinstance(mark, dict):
            ending.handed_back(mark, partial(reject, *args, **kw))
            return None
        try:
            return reject(*args, **kw)
        finally:
            ending.finished()


def _route_home(message: Any, queue: str) -> None:
    """A delivery from a migration's temporary queue is routed, for Celery, as one from the
    queue it stands in for: Celery sends a retry to the exchange and routing key its
    delivery came with, and the temporary queue is deleted when the migration ends, so a
    retry sent there afterwards would be confirmed and routed nowhere."""
    home = home_queue(queue)
    info = getattr(message, "delivery_info", None)
    if home != queue and isinstance(info, dict):
        info["exchange"] = ""  # Celery then sends to the queue named by the routing key
        info["routing_key"] = home
