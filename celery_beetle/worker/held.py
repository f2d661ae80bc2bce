"""The holding table: the copies the gate does not hand to the pool now.

:class:`Holding` settles them, by verdict.

=============  ======================================================================
verdict        what the table does
=============  ======================================================================
duplicate      ack, after its event is written where the audit needs it
expired        the same
deferred       look again on a timer; widen the prefetch window within the bounds
waiting        hold it until the copy in flight here ends (a held :class:`~.deliveries.Twin`
               costs no Redis call, no kombu Message and no strategy call)
parked         hold it until the store answers again (:mod:`.outage`)
given_back     requeue now: its queue is handed back to its brokers
=============  ======================================================================

A deferred copy under a running lease is looked at again after 50 ms, then doubling, and
never later than the lease's end or ``recheck_max_s``.
Every held copy belongs to a consumer generation; a restart of the consumer forgets them,
and their brokers deliver them again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from celery_beetle.store.state import Status
from celery_beetle.worker.deliveries import HELD_MARK, CompletedMemory, Delivery, QoSLike, Twin
from celery_beetle.worker.handback import channel_open, requeue
from celery_beetle.worker.outage import StoreOutage
from celery_beetle.worker.settle import GateTrace, Settle
from celery_beetle.worker.verdict import Verdict
from kombu_beetle.brokers import incarnation_of

__all__ = ["Holding"]

logger = logging.getLogger(__name__)


class Holding:
    """The holding table of a :class:`~celery_beetle.worker.gate.DeliveryGate`.

    - ``stats``: the gate's counts, by verdict.
    - ``trace``, ``settle``: the gate's trace writer and ack rule (:mod:`.settle`).
    - ``call_later(seconds, fn)``: a timer on the event loop.
    - ``qos()``: the consumer's prefetch QoS now, widened for each deferred copy.
    - ``examine(d)``: the gate's look at a delivery, for one that comes off a timer.
    - ``handing_back(message)``: True while its queue is handed back to its brokers.
    - ``outage``: the store's outage (no twin is held while it lasts).
    - ``scope_of_message(message)``: the dedup scope of the queue a copy came from.
    - ``completed``: the runs that completed here a moment ago.
    """

    def __init__(
        self,
        *,
        stats: Counter[str],
        trace: GateTrace,
        settle: Settle,
        call_later: Callable[[float, Callable[[], None]], Any],
        qos: Callable[[], QoSLike | None],
        examine: Callable[[Delivery], Any],
        handing_back: Callable[[Any], bool],
        outage: StoreOutage,
        scope_of_message: Callable[[Any], str],
        completed: CompletedMemory,
        max_deferred: int,
        max_deferred_bytes: int,
        recheck_min_s: float,
        recheck_max_s: float,
    ) -> None:
        self.stats = stats
        self.trace = trace
        self.settle = settle
        self.call_later = call_later
        self.qos = qos
        self.examine = examine
        self.handing_back = handing_back
        self.outage = outage
        self.scope_of_message = scope_of_message
        self.completed = completed
        self.max_deferred = max_deferred
        self.max_deferred_bytes = max_deferred_bytes
        self.recheck_min_s = recheck_min_s
        self.recheck_max_s = recheck_max_s
        #: the consumer generation; a copy from an older one cannot be acked any more
        self.generation = 0
        self.in_flight: set[tuple[str, str]] = set()
        self.waiting: dict[tuple[str, str], list[Delivery | Twin]] = {}
        self.parked: list[Delivery] = []
        self.deferred = 0
        self.deferred_bytes = 0

    @property
    def held(self) -> int:
        """Copies waiting for a twin or parked (deferred ones sit on timers)."""
        return sum(len(w) for w in self.waiting.values()) + len(self.parked)

    def reset(self) -> None:
        """Forget every held copy: the consumer's connection is going away."""
        self.generation += 1
        self.in_flight.clear()
        self.waiting.clear()
        self.parked.clear()
        self.deferred = self.deferred_bytes = 0

    def hold_twin(self, raw: Any, task_name: str, deliver: Callable[[Any], Any]) -> bool:
        """The transport's delivery filter (:data:`kombu_beetle.channel_host.DeliveryFilter`):
        True when it took a raw delivery as a :class:`Twin`.

        It does so when a copy with its identity is in flight here (the twin waits for that
        run) or completed here a moment ago (the twin is acked now).
        Either way it costs no Redis call, no kombu Message and no Celery strategy call.
        Anything else is left to :meth:`~.gate.DeliveryGate.handle`.
        """
        if self.outage.paused:
            return False
        message_id = raw.properties.get("message_id")
        if not isinstance(message_id, str) or not message_id:
            return False
        key = (self.scope_of_message(raw), message_id)
        in_flight = key in self.in_flight
        if not in_flight and key not in self.completed:
            return False
        twin = Twin(raw, task_name, key, deliver, self.generation, incarnation_of(raw))
        if self.handing_back(twin):
            return False
        self.stats["delivered"] += 1
        self.stats["twins_held"] += 1
        self.trace.delivered(message_id, key[0], task_name, twin)
        raw.delivery_info[HELD_MARK] = True
        if in_flight:
            self.wait(key, twin)
        else:
            self.stats["known_completed"] += 1
            self.drop_twin(twin)
        return True

    def wait(self, key: tuple[str, str], d: Delivery | Twin) -> Verdict:
        """Hold ``d`` until the copy in flight under ``key`` ends."""
        self.stats[Verdict.WAITING] += 1
        self.waiting.setdefault(key, []).append(d)
        return Verdict.WAITING

    def park(self, d: Delivery) -> Verdict:
        """Hold ``d`` until the store answers again."""
        self.parked.append(d)
        self.stats[Verdict.PARKED] += 1
        return Verdict.PARKED

    def take_parked(self) -> list[Delivery]:
        """The parked copies of this generation, in order; the table forgets them all."""
        parked, self.parked = self.parked, []
        return [d for d in parked if d.generation == self.generation]

    def drop(self, d: Delivery, verdict: Verdict, status: Status | None = None) -> Verdict:
        """Ack ``d`` as a duplicate or expired copy, after its event is written."""
        self.stats[verdict] += 1
        detail = {"status": status.value} if status is not None else None
        facts = d.facts
        self.trace.write(verdict, facts.message_id, facts.scope, d.message, d.task_name, detail)
        self.settle.ack(d.message)
        return verdict

    def drop_twin(self, twin: Twin) -> None:
        """Ack a twin as a duplicate of a message that completed here."""
        self.stats[Verdict.DUPLICATE] += 1
        detail = {"status": Status.COMPLETED.value}
        scope, message_id = twin.key
        self.trace.write(Verdict.DUPLICATE, message_id, scope, twin, twin.task_name, detail)
        self.settle.ack(twin)

    def deliver_on(self, twin: Twin) -> None:
        """Send a held twin on through Celery and the gate, soon (not from inside the
        caller's batch of Redis replies)."""
        self.call_later(0, partial(self._deliver_twin, twin))

    def _deliver_twin(self, twin: Twin) -> None:
        if twin.generation != self.generation or twin.stale or twin.settled:
            return  # its connection or channel is gone: its broker delivers it again
        try:
            twin.deliver(twin.raw)
        except Exception:  # unacked: its broker delivers it again with the channel
            logger.exception("beetle: cannot deliver a held copy of %s on", twin.key[1][:100])

    def defer(self, d: Delivery, delay_ms: int, running: bool) -> Verdict:
        """Hold ``d`` until the lease ends or the retry is due, and look again then.

        A deferred copy holds a slot of the prefetch window until it is looked at again.
        The window is widened for it only within ``max_deferred`` and ``max_deferred_bytes``.
        """
        self.stats[Verdict.DEFERRED] += 1
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
        facts = d.facts
        self.trace.write(
            Verdict.DEFERRED, facts.message_id, facts.scope, d.message, d.task_name, detail
        )
        self.call_later(delay_s, partial(self._recheck, d))
        return Verdict.DEFERRED

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
        self.examine(d)

    def give_back_held(self) -> int:
        """Requeue now every waiting or parked copy whose queue is handed back; deferred
        ones go back when they are next looked at. Returns how many."""
        given = 0
        for key, waiters in list(self.waiting.items()):
            back = [d for d in waiters if self.handing_back(d.message)]
            for d in back:
                waiters.remove(d)
                requeue(d.message)
            if not waiters:
                del self.waiting[key]
            given += len(back)
        back = [d for d in self.parked if self.handing_back(d.message)]
        self.parked = [d for d in self.parked if d not in back]
        for d in back:
            requeue(d.message)
        self.stats[Verdict.GIVEN_BACK] += given + len(back)
        return given + len(back)

    def run_ended(self, key: tuple[str, str], completed: bool) -> None:
        """The run of ``key`` here ended: settle the copies that waited for it.

        After a completion they are duplicates for sure, acked now without a read.
        After any other ending each goes through the gate again, soon.
        """
        self.in_flight.discard(key)
        if completed:
            self.completed.remember(key)
        waiters = self.waiting.pop(key, None)
        if not waiters:
            return
        if completed:
            self.each_waiter(waiters, self.drop_twin, self._drop_completed)
            return
        self.call_later(0, partial(self.wake, waiters))

    def _drop_completed(self, d: Delivery) -> None:
        self.stats["known_completed"] += 1
        self.drop(d, Verdict.DUPLICATE, Status.COMPLETED)

    def wake(self, waiters: list[Delivery | Twin]) -> None:
        """Send each waiter on: a twin through Celery, a delivery to the gate."""
        self.each_waiter(waiters, self.deliver_on, self._examine_again)

    def _examine_again(self, d: Delivery) -> None:
        if d.generation == self.generation:
            self.examine(d)

    @staticmethod
    def each_waiter(
        waiters: list[Delivery | Twin],
        twin: Callable[[Twin], Any],
        delivery: Callable[[Delivery], Any],
    ) -> None:
        """Call ``twin`` for each held twin and ``delivery`` for each delivery, in order."""
        for waiter in waiters:
            if isinstance(waiter, Twin):
                twin(waiter)
            else:
                delivery(waiter)
