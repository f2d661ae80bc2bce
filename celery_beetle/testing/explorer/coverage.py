"""What a soak draws of the newer kinds, and a choice of seeds that draws each of them often.

A mark names one of the later versions' faults, settings or workloads a scenario draws
(:data:`MARKS`); :func:`marks` reads them off a scenario. Some are rare: a ``replica_lag``
comes in about one scenario in twenty, so a soak of 60 seeds in order may draw it once.

A balanced soak (:class:`BalancedSeeds`) alternates two streams. One scenario is the next
seed in order, as a soak always ran: the unbiased stream. The next is the lowest seed not
yet run, from the in-order position up to ``window`` seeds ahead, that draws the mark drawn
fewest times so far (ties in :data:`MARKS` order; a mark no seed of the window draws is
passed over). The counts include every scenario run, from either stream. No seed runs
twice: the in-order stream steps over a seed the balanced one took. Seeds are only chosen,
never changed: each scenario is still ``draw(seed)``, replayed with ``scripts/explore --seed
S``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from celery_beetle.testing.explorer.scenario import Scenario, draw

__all__ = ["MARKS", "BalancedSeeds", "marks", "marks_of_seed", "next_seed", "tally"]

#: the newer kinds a soak should draw often, in the order ties are broken
MARKS = (
    "redis_failover",  # fault: a Sentinel's master killed, its replica promoted
    "redis_failover_waiting",  # a redis_failover with ``beetle_redis_wait_replicas`` set
    "replica_lag",  # fault: the replica frozen while writes wait for it
    "broker_replace",  # fault: a broker replaced by an empty node
    "worker_upgrade",  # a worker of the previous release upgraded during the run
    "untraced",  # a worker slot with tracing off
    "rabbit4_delivery_limit",  # RabbitMQ 4's quorum queues and delivery-limit
    "consumer_timeout",  # a lowered consumer_timeout
    "queues_bound_ttl",  # fault queues_bound: a small TTL on the run's queues
    "queues_bound_max_length",  # fault queues_bound: a small max-length
    "chord",  # chords (a result backend)
    "long_chain",  # chains of three or four links
    "retry_no_countdown",  # self.retry without a countdown
    "retry_past_max",  # a body that retries once past its max_retries
)


def marks(scenario: Scenario) -> frozenset[str]:
    """The marks of :data:`MARKS` that ``scenario`` draws."""
    s = scenario.settings
    faults = {f.kind for f in scenario.faults}
    found = set()
    if "redis_failover" in faults:
        found.add("redis_failover")
        if s.wait_replicas:
            found.add("redis_failover_waiting")
    found.update(faults & {"replica_lag", "broker_replace"})
    if s.previous:
        found.add("worker_upgrade")
    if s.untraced:
        found.add("untraced")
    if s.rabbit4:
        found.add("rabbit4_delivery_limit")
    if s.consumer_timeout_ms:
        found.add("consumer_timeout")
    for f in scenario.faults:
        if f.kind == "queues_bound":  # target as the nemesis reads it: even TTL, odd max-length
            found.add("queues_bound_ttl" if f.target % 2 == 0 else "queues_bound_max_length")
    for item in scenario.items:
        if item.kind == "chord":
            found.add("chord")
        elif item.kind == "chain" and item.members:
            found.add("long_chain")
        elif item.kind == "retry" and item.mode == "past_max":
            found.add("retry_past_max")
        elif item.kind == "retry" and item.mode == "ok" and item.retry_s == 0:
            found.add("retry_no_countdown")
    return frozenset(found)


_CACHE: dict[int, frozenset[str]] = {}


def marks_of_seed(seed: int) -> frozenset[str]:
    """``marks(draw(seed))``, remembered (a draw takes about half a millisecond)."""
    if seed not in _CACHE:
        _CACHE[seed] = marks(draw(seed))
    return _CACHE[seed]


def tally(scenarios: Iterable[Scenario]) -> Counter[str]:
    """How many of ``scenarios`` draw each mark, with every mark of :data:`MARKS` present."""
    counts: Counter[str] = Counter(dict.fromkeys(MARKS, 0))
    for scenario in scenarios:
        counts.update(marks(scenario))
    return counts


def next_seed(counts: Counter[str], run: set[int], start: int, window: int = 400) -> int:
    """The lowest seed from ``start`` to ``start + window`` not in ``run`` that draws the
    mark with the fewest ``counts`` (ties in :data:`MARKS` order); a mark no such seed
    draws is passed over, and when none draws any, the lowest seed not in ``run``."""
    seeds = [s for s in range(start, start + window + 1) if s not in run]
    for mark in sorted(MARKS, key=lambda m: (counts[m], MARKS.index(m))):
        for seed in seeds:
            if mark in marks_of_seed(seed):
                return seed
    return seeds[0] if seeds else start + window + 1


class BalancedSeeds:
    """The seeds of a balanced soak from ``first``: in turn the next seed in order and
    :func:`next_seed`'s choice, each seed once; ``counts`` holds every yielded seed's marks."""

    def __init__(self, first: int, window: int = 400) -> None:
        self.window = window
        self.cursor = first  # the in-order stream's next seed
        self.run: set[int] = set()
        self.counts: Counter[str] = Counter(dict.fromkeys(MARKS, 0))

    def __iter__(self) -> Iterator[int]:
        balanced = False
        while True:
            while self.cursor in self.run:
                self.cursor += 1
            if balanced:
                seed = next_seed(self.counts, self.run, self.cursor, self.window)
            else:
                seed = self.cursor
            self.run.add(seed)
            self.counts.update(marks_of_seed(seed))
            balanced = not balanced
            yield seed
