"""What the gate holds, and what it does with a copy it does not hand to the pool now.

========================  ==================================================================
:class:`Delivery`         a delivery the gate looked at: its facts, how to start it, and the
                          consumer generation it came with
:class:`Twin`             the raw second copy of a message in flight (or done) here, held by
                          the transport's delivery filter before kombu made a Message of it
:class:`CompletedMemory`  the runs that completed here a moment ago
========================  ==================================================================

:class:`Holding` is what the gate (:class:`~celery_beetle.worker.gate.DeliveryGate`) does
with a copy it does not run now, by the verdicts of :mod:`.gate`: **duplicate** and
**expired** (:meth:`~Holding._drop`: acked once its event is written where the audit needs
it), **defer** (:meth:`~Holding._defer`: looked at again on a timer, the prefetch window
widened within ``max_deferred``), **wait** (:meth:`~Holding.hold_twin`: a twin held without
a Redis call, acked when its run completes here), **hand back** (requeued after a backoff,
:mod:`.handback`; :meth:`~Holding.give_back_held` for a queue handed back to its brokers).
It is part of the gate, apart only so each module reads on its own (as :mod:`.bad_input`);
what it uses of the gate is named at its top.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from celery_beetle.store.state import MessageFacts, Status
from celery_beetle.worker.handback import HandBacks, ack, channel_open, requeue
from kombu_beetle.brokers import incarnation_of, settle_raw
from kombu_beetle.scopes import scope_of

__all__ = ["HELD_MARK", "CompletedMemory", "Delivery", "Holding", "QoSLike", "Twin"]

logger = logging.getLogger(__name__)


class QoSLike(Protocol):
    def increment_eventually(self, n: int = 1) -> int: ...

    def decrement_eventually(self, n: int = 1) -> int: ...


@dataclass(eq=False)
class Delivery:
    """One delivery held by the gate, and how to start it when its turn comes."""

    message: Any
    task_name: str
    facts: MessageFacts
    start: Callable[[Callable[[], None]], None]
    generation: int
    qos: QoSLike | None = None  # the QoS whose window it widened while deferred
    rechecks: int = 0
    size: int = 0  # body bytes, counted against max_deferred_bytes while deferred

    @property
    def key(self) -> tuple[str, str]:
        return self.facts.identity


#: in a held twin's ``delivery_info`` (kombu's Message shares the dict): traced already
HELD_MARK = "beetle_held"


@dataclass(eq=False)
class Twin:
    """A copy held before kombu made a Message of it (:meth:`Holding.hold_twin`): a
    copy with its identity is running in this worker. When that run completes the twin is
    acked as a duplicate; after any other ending it is delivered on, through Celery and the
    gate, as any copy. A twin is its own message view (the trace and hand-back helpers read
    ``headers``, ``delivery_info`` and ``channel`` and call ``ack`` and ``reject``)."""

    raw: Any
    task_name: str
    key: tuple[str, str]
    deliver: Callable[[Any], Any]
    generation: int
    incarnation: int = 0  # of its broker channel as it arrived (kombu_beetle.brokers)
    settled: bool = False

    @property
    def message(self) -> Twin:
        return self

    @property
    def stale(self) -> bool:
        """Its channel was closed and reopened since it arrived: the broker gave it back."""
        return incarnation_of(self.raw) != self.incarnation

    @property
    def headers(self) -> dict[str, Any]:
        return self.raw.properties.get("application_headers") or {}

    @property
    def properties(self) -> dict[str, Any]:
        return self.raw.properties

    @property
    def delivery_info(self) -> dict[str, Any]:
        return self.raw.delivery_info

    @property
    def channel(self) -> Any:
        return self.raw.channel

    def ack(self) -> None:
        if not self.settled:
            self.settled = True
            settle_raw(self.raw, self.incarnation)

    def reject(self, requeue: bool = True) -> None:
        if not self.settled:
            self.settled = True
            settle_raw(self.raw, self.incarnation, requeue=requeue)


class CompletedMemory:
    """The runs that completed here, for a while: a message's other copy usually arrives
    within milliseconds and can then be dropped without a Redis read. A completed record
    never changes, so the memory cannot be wrong, only forgotten."""

    def __init__(self, clock: Callable[[], int], size: int, keep_ms: int) -> None:
        self.clock, self.size, self.keep_ms = clock, size, keep_ms
        self._until: OrderedDict[tuple[str, str], int] = OrderedDict()

    def remember(self, key: tuple[str, str]) -> None:
        until = self._until
        until[key] = self.clock() + self.keep_ms
        until.move_to_end(key)
        while len(until) > self.size:
            until.popitem(last=False)

    def __contains__(self, key: tuple[str, str]) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until < self.clock():
            del self._until[key]
            return False
        return True


class Holding:
    """Drop, defer, hold a twin, hand back: for :class:`~celery_beetle.worker.gate.DeliveryGate`."""

    # provided by the gate
    stats: Counter[str]
    paused: bool
    generation: int
    scopes: Mapping[str, str]
    queue_of: Callable[[Any], str]
    call_later: Callable[[float, Callable[[], None]], Any]
    qos: Callable[[], QoSLike | None]
    handing_back: Callable[[Any], bool]
    handbacks: HandBacks
    max_deferred: int
    max_deferred_bytes: int
    recheck_min_s: float
    recheck_max_s: float
    deferred: int
    deferred_bytes: int
    _in_flight: set[tuple[str, str]]
    _waiting: dict[tuple[str, str], list[Delivery | Twin]]
    _parked: list[Delivery]
    _completed: CompletedMemory
    _acks_after_trace: list[Callable[[], None]]

    if TYPE_CHECKING:

        def _examine(self, d: Delivery) -> str: ...

        def _acking_after_trace(self) -> bool: ...

        def _trace(
            self,
            event: str,
            message_id: str,
            queue: str,
            task_name: str,
            message: Any,
            detail: dict[str, Any] | None = None,
        ) -> None: ...

    def hold_twin(self, raw: Any, task_name: str, deliver: Callable[[Any], Any]) -> bool:
        """The transport's delivery filter (:data:`kombu_beetle.channel_host.DeliveryFilter`)
        for a gated task's raw delivery: True when the gate took it as a :class:`Twin`,
        because a copy with its identity is in flight here (it waits for that run) or
        completed here a moment ago (it is acked now). Either way it costs no Redis call,
        no kombu Message and no Celery strategy call: the second copy of a redundant pair
        should cost far less than the first. Anything else (no ``message_id``, Redis
        unavailable, a queue being handed back) is left to :meth:`handle`."""
        if self.paused:
            return False
        message_id = raw.properties.get("message_id")
        if not isinstance(message_id, str) or not message_id:
            return False
        key = (scope_of(self.scopes, self.queue_of(raw)), message_id)
        in_flight = key in self._in_flight
        if not in_flight and key not in self._completed:
            return False
        twin = Twin(raw, task_name, key, deliver, self.generation, incarnation_of(raw))
        if self.handing_back(twin):
            return False
        self.stats["delivered"] += 1
        self.stats["twins_held"] += 1
        self._trace("delivered", message_id, key[0], task_name, twin)
        raw.delivery_info[HELD_MARK] = True
        if in_flight:
            self.stats["waiting"] += 1
            self._waiting.setdefault(key, []).append(twin)
        else:
            self.stats["known_completed"] += 1
            self._drop_twin(twin)
        return True

    def _drop_twin(self, twin: Twin) -> None:
        """Ack a twin as a duplicate of a message that completed here."""
        self.stats["duplicate"] += 1
        detail = {"status": Status.COMPLETED.value}
        self._trace("duplicate", twin.key[1], twin.key[0], twin.task_name, twin, detail)
        if self._acking_after_trace():
            self._acks_after_trace.append(lambda: ack(twin))
        else:
            ack(twin)

    def _deliver_on(self, twin: Twin) -> None:
        """Send a held twin on through Celery and the gate, soon (not from inside the
        caller's batch of Redis replies), unless its consumer restarted meanwhile."""

        def deliver() -> None:
            if twin.generation != self.generation or twin.stale or twin.settled:
                return  # its connection or channel is gone: its broker delivers it again
            try:
                twin.deliver(twin.raw)
            except Exception:  # unacked: its broker delivers it again with the channel
                logger.exception("beetle: cannot deliver a held copy of %s on", twin.key[1][:100])

        self.call_later(0, deliver)

    def _drop(self, d: Delivery, event: str, status: Any = None) -> str:
        self.stats[event] += 1
        detail = {"status": status.value} if status is not None else None
        self._trace(event, d.facts.message_id, d.facts.scope, d.task_name, d.message, detail)
        if self._acking_after_trace():
            # a dropped copy's event is the audit's evidence of how it was settled (a
            # ``duplicate`` of a completed message whose own ``completed`` event died with its
            # worker, an ``expired``): written before the copy is acked away
            self._acks_after_trace.append(lambda: ack(d.message))
        else:
            ack(d.message)
        return event

    def _defer(self, d: Delivery, delay_ms: int, running: bool) -> str:
        """Hold ``d`` until the lease ends or the retry is due. A run elsewhere usually ends
        long before its lease does, so under a lease the copy is looked at again after
        50 ms, 100 ms, 200 ms, ... (not later than the lease's end): its ack, and the
        memory and prefetch slot it holds, need not wait for a lease sized for the worst
        case. Soon matters: a deferred copy holds a slot of the prefetch window until it
        is looked at again (the transport widens the window for it: kombu_beetle.prefetch,
        but only within max_deferred)."""
        self.stats["deferred"] += 1
        self.deferred += 1
        self.deferred_bytes += d.size
        qos = self.qos()
        within = (
            self.deferred <= self.max_deferred and self.deferred_bytes <= self.max_deferred_bytes
        )
        if qos is not None and within:
            qos.increment_eventually()
            d.qos = qos
        elif qos is not None:
            self.stats["deferred_past_bound"] += 1
        wait_s = max(delay_ms, 0) / 1000
        if running:
            wait_s = min(wait_s, self.recheck_min_s * 2**d.rechecks)
        d.rechecks += 1
        delay_s = min(wait_s, self.recheck_max_s) + 0.02
        detail = {"delay_s": round(delay_ms / 1000, 3)}
        self._trace("deferred", d.facts.message_id, d.facts.scope, d.task_name, d.message, detail)
        self.call_later(delay_s, lambda: self._recheck(d))
        return "deferred"

    def _recheck(self, d: Delivery) -> None:
        if d.generation != self.generation:
            return
        self.deferred -= 1
        self.deferred_bytes -= d.size
        if d.qos is not None:
            d.qos.decrement_eventually()
            d.qos = None
        if not channel_open(d.message):
            # its broker went away; the broker delivers it again when it comes back
            self.stats["forgotten"] += 1
            return
        self._examine(d)

    def give_back_held(self) -> int:
        """Requeue now every waiting or parked copy that :attr:`handing_back` names (a
        waiting copy's twin may be held for hours, as an ETA task from another queue);
        deferred ones go back when they are next looked at. Returns how many."""
        given = 0
        for key, waiters in list(self._waiting.items()):
            back = [d for d in waiters if self.handing_back(d.message)]
            for d in back:
                waiters.remove(d)
                requeue(d.message)
            if not waiters:
                del self._waiting[key]
            given += len(back)
        back = [d for d in self._parked if self.handing_back(d.message)]
        self._parked = [d for d in self._parked if d not in back]
        for d in back:
            requeue(d.message)
        self.stats["given_back"] += given + len(back)
        return given + len(back)

    def hand_back(self, message: Any) -> str:
        """Requeue a delivery after a backoff (for a caller whose step failed)."""
        return self._hand_back(message, None)

    def _hand_back(self, message: Any, key: Any, delay_s: float | None = None) -> str:
        self.stats["handed_back"] += 1
        self.handbacks.requeue_later(message, key, delay_s)
        return "handed_back"
