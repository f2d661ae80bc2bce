"""What the gate holds: a delivery it looked at, a raw twin, and the runs that completed here.

========================  ==================================================================
:class:`Delivery`         a delivery the gate looked at: its facts, how to start it, and the
                          consumer generation it came with
:class:`Twin`             the raw second copy of a message in flight (or done) here, held by
                          the transport's delivery filter before kombu made a Message of it
:class:`CompletedMemory`  the runs that completed here a moment ago
========================  ==================================================================
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from celery_beetle.store.state import MessageFacts
from kombu_beetle.brokers import incarnation_of, settle_raw

__all__ = ["HELD_MARK", "CompletedMemory", "Delivery", "Ending", "QoSLike", "Twin"]


class QoSLike(Protocol):
    """The consumer's prefetch QoS, widened for each deferred copy."""

    def increment_eventually(self, n: int = 1) -> int: ...

    def decrement_eventually(self, n: int = 1) -> int: ...


class Ending(Protocol):
    """How a started delivery says its run ended (:class:`~.ending.RunEnding`)."""

    def finished(self) -> None: ...

    def handed_back(self, mark: dict[str, Any], reject: Callable[[], Any]) -> None: ...


@dataclass(eq=False)
class Delivery:
    """One delivery held by the gate, and how to start it when its turn comes."""

    message: Any
    task_name: str
    facts: MessageFacts
    start: Callable[[Ending], None]
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
    """A copy held before kombu made a Message of it (:meth:`~.held.Holding.hold_twin`).

    A copy with its identity is running in this worker.
    When that run completes, the twin is acked as a duplicate.
    After any other ending it is delivered on, through Celery and the gate, as any copy.
    A twin is its own message view for the trace and hand-back helpers.
    """

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
    """The runs that completed here, for ``keep_ms``, at most ``size`` of them.

    A message's other copy usually arrives within milliseconds; it is then dropped without
    a Redis read.
    A completed record never changes, so the memory cannot be wrong, only forgotten.
    """

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
