"""Fresh deliveries for a prefork pool, claimed in full as a pool process comes free.

With a prefork pool, the gate keeps a fresh delivery of a task it claims until one of the
pool's processes is free. It then claims the message in full, in its pipelined batch: the
claim counts the attempt and starts the whole lease, and the process runs the body without
a Redis call of its own. The gate stores the completion before the ack, as for any run on
its claim. Without this, each run would cost a reservation from the gate, then a start from
the pool process, which waits for Redis's reply before the body.

Rules:

- A claim in full is made only for a process that is free: one not running a request and
  not promised to another claim still waiting for its reply. An attempt therefore counts
  from the moment a body is about to begin.
- Deliveries wait here in the order they arrived, unacked. While they wait they are in
  flight, so a twin waits for them and costs no call.
- A delivery that waited is looked at again as it leaves: a consumer that restarted drops
  it, and a store that went away parks it.
- Every other delivery takes the gate's usual path: redelivered copies, copies looked at
  again, tasks the gate does not claim (an ETA), rate-limited tasks (Celery holds them
  before the pool), and any pool but prefork.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from celery_beetle.store.outcome import Limits
from celery_beetle.worker.asking import Asking
from celery_beetle.worker.deliveries import Delivery
from celery_beetle.worker.held import Holding
from celery_beetle.worker.outage import StoreOutage
from celery_beetle.worker.verdict import Verdict

__all__ = ["FreeProcesses", "PoolDispatch"]


class FreeProcesses(Protocol):
    """The prefork pool as the gate sees it (:class:`~.wiring.PreforkFree`)."""

    def __call__(self) -> int:
        """How many processes are free now."""

    def takes(self, task_name: str) -> bool:
        """Whether a task's fresh deliveries are claimed in full for a free process."""


class PoolDispatch:
    """Fresh deliveries waiting for a free prefork process (see the module).

    - ``pool()``: the pool's :class:`FreeProcesses`, None for a pool that is not prefork.
    - ``claims_for(message, task_name)``: the limits to claim with, or None (the gate reads).
    - ``asking``, ``holding``, ``outage``: the gate's parts that send the claim, hold what
      waits, and know whether the store is away.
    - ``handing_back(message)``, ``clock()``: the gate's view of a delivery as it leaves.
    - ``examine(d)``: the gate's usual look at a delivery that may not be claimed in full.
    """

    def __init__(
        self,
        *,
        pool: Callable[[], FreeProcesses | None],
        claims_for: Callable[[Any, str], Limits | None],
        asking: Asking,
        holding: Holding,
        outage: StoreOutage,
        handing_back: Callable[[Any], bool],
        clock: Callable[[], int],
        examine: Callable[[Delivery], Verdict],
        stats: Counter[str],
    ) -> None:
        self.pool = pool
        self.claims_for = claims_for
        self.asking = asking
        self.holding = holding
        self.outage = outage
        self.handing_back = handing_back
        self.clock = clock
        self.examine = examine
        self.stats = stats
        #: (delivery, the limits to claim it with), oldest first
        self.waiting: deque[tuple[Delivery, Limits]] = deque()
        #: claims in full sent and not answered yet: each has a free process promised
        self.starting = 0

    def offer(self, d: Delivery) -> Verdict | None:
        """Take a fresh delivery: claim it in full now if a process is free, else keep it
        until one is. None: not one for this path (the gate reserves it or reads)."""
        pool = self.pool()
        if pool is None or not pool.takes(d.task_name):
            return None
        limits = self.claims_for(d.message, d.task_name)
        if limits is None:
            return None
        if not self.waiting and self._free():
            self._start(d, limits)
        else:
            self.holding.in_flight.add(d.key)
            self.waiting.append((d, limits))
            self.stats["waiting_for_pool"] += 1
        return Verdict.READING

    def on_tick(self) -> None:
        """Each pass of the event loop: claim what waits, one per free process. The claims
        go out at once: the tick runs as the loop is about to wait for events."""
        if self.pump():
            self.asking.send_now()

    def pump(self) -> bool:
        """Claim what waits, one per free process, in the next batch; True if any waited.
        Also called as a run ends, so that the claim for its process joins the batch of
        the run's completion instead of waiting for the loop's tick."""
        took = False
        while self.waiting and self._free():
            d, limits = self.waiting.popleft()
            took = True
            if d.generation != self.holding.generation:
                continue  # its consumer restarted: the broker delivers it again
            self.holding.in_flight.discard(d.key)
            if self._ready(d):
                self._start(d, limits)
            else:
                self._look_again(d)
        return took

    def reset(self) -> None:
        """Forget what waits: the consumer's connection is going away."""
        self.waiting.clear()
        self.starting = 0

    def _free(self) -> bool:
        pool = self.pool()
        return pool is not None and pool() - self.starting > 0

    def _ready(self, d: Delivery) -> bool:
        """Whether a delivery that waited may be claimed in full as it leaves."""
        gone = self.outage.paused or self.handing_back(d.message) or d.key in self.holding.completed
        return not gone and d.facts.expires_at_ms > self.clock()

    def _start(self, d: Delivery, limits: Limits) -> None:
        self.starting += 1
        self.stats["started_for_pool"] += 1
        self.asking.start(d, limits, self._answered)

    def _answered(self) -> None:
        self.starting = max(0, self.starting - 1)

    def _look_again(self, d: Delivery) -> None:
        """``d`` waited while something changed (the store away, its queue handed back, its
        message completed here): the gate looks at it as at any delivery. Twins that waited
        for it are looked at too, unless it is in flight again."""
        self.examine(d)
        if d.key not in self.holding.in_flight:
            self.holding.wake(self.holding.waiting.pop(d.key, []))
