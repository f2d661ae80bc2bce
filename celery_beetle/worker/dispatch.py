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
  again, tasks the gate does not claim (an ETA), and any pool but prefork.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from celery_beetle.store.outcome import Limits
from celery_beetle.worker.asking import Asking
from celery_beetle.worker.deliveries import Delivery
from celery_beetle.worker.held import Holding
from celery_beetle.worker.verdict import Verdict

__all__ = ["PoolDispatch"]


class PoolDispatch:
    """Fresh deliveries waiting for a free prefork process (see the module).

    - ``free_processes()``: the pool's processes not running or holding a request now
      (0 while the pool is stopped).
    - ``asking``, ``holding``: the gate's parts that send the claim and hold what waits.
    - ``ready(d)``: whether a delivery that waited may be claimed in full as it leaves.
    - ``examine(d)``: the gate's usual look at one that may not.
    """

    def __init__(
        self,
        *,
        free_processes: Callable[[], int],
        asking: Asking,
        holding: Holding,
        ready: Callable[[Delivery], bool],
        examine: Callable[[Delivery], Verdict],
        stats: Counter[str],
    ) -> None:
        self.free_processes = free_processes
        self.asking = asking
        self.holding = holding
        self.ready = ready
        self.examine = examine
        self.stats = stats
        #: (delivery, the limits to claim it with), oldest first
        self.waiting: deque[tuple[Delivery, Limits]] = deque()
        #: claims in full sent and not answered yet: each has a free process promised
        self.starting = 0

    def offer(self, d: Delivery, limits: Limits) -> Verdict:
        """Claim ``d`` in full now if a process is free, else keep it until one is."""
        if not self.waiting and self._free():
            self._start(d, limits)
        else:
            self.holding.in_flight.add(d.key)
            self.waiting.append((d, limits))
            self.stats["waiting_for_pool"] += 1
        return Verdict.READING

    def on_tick(self) -> None:
        """Each pass of the event loop: claim what waits, one per free process."""
        while self.waiting and self._free():
            d, limits = self.waiting.popleft()
            if d.generation != self.holding.generation:
                continue  # its consumer restarted: the broker delivers it again
            self.holding.in_flight.discard(d.key)
            if self.ready(d):
                self._start(d, limits)
            else:
                self._look_again(d)

    def reset(self) -> None:
        """Forget what waits: the consumer's connection is going away."""
        self.waiting.clear()
        self.starting = 0

    def _free(self) -> bool:
        return self.free_processes() - self.starting > 0

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
