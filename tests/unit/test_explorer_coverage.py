"""The balanced soak's choice of seeds (:mod:`celery_beetle.testing.explorer.coverage`):
drawn scenarios only, no servers."""

from __future__ import annotations

from collections import Counter
from itertools import islice
from pathlib import Path

from celery_beetle.testing.explorer.coverage import (
    MARKS,
    BalancedSeeds,
    marks,
    marks_of_seed,
    next_seed,
    tally,
)
from celery_beetle.testing.explorer.report import Row, write_report
from celery_beetle.testing.explorer.scenario import Fault, Item, Scenario, Settings, draw


def test_every_mark_is_drawn_by_some_seed():
    found = set().union(*(marks_of_seed(seed) for seed in range(97000, 97400)))
    assert found == set(MARKS)


def test_marks_name_what_the_scenario_draws():
    scenario = Scenario(
        seed=1,
        settings=Settings(sentinel=True, wait_replicas=1, rabbit4=True, consumer_timeout_ms=5000),
        items=(
            Item(0, "chain", members=("ok", "ok")),
            Item(1, "chain"),  # two links: not a long chain
            Item(2, "retry", retries=1, retry_s=0.0),
            Item(3, "retry", retries=1, retry_s=1.5),  # a countdown
        ),
        faults=(Fault(1.0, "redis_failover"), Fault(2.0, "queues_bound", target=1, bound=5)),
    )
    assert marks(scenario) == {
        "redis_failover",
        "redis_failover_waiting",
        "rabbit4_delivery_limit",
        "consumer_timeout",
        "queues_bound_max_length",
        "long_chain",
        "retry_no_countdown",
    }
    plain = Scenario(seed=2, settings=Settings(), items=(Item(0, "work"),))
    assert marks(plain) == frozenset()


def test_the_seeds_alternate_in_order_and_balanced():
    seeds = list(islice(BalancedSeeds(97000), 20))
    in_order = seeds[0::2]
    assert in_order == sorted(in_order) and in_order[0] == 97000
    # the in-order stream takes every seed the balanced one did not, one after another
    assert set(range(97000, in_order[-1] + 1)) <= set(seeds)
    counts: Counter[str] = Counter(dict.fromkeys(MARKS, 0))
    for n, seed in enumerate(seeds):
        if n % 2:
            cursor = min(s for s in range(97000, 98000) if s not in seeds[:n])
            assert seed == next_seed(counts, set(seeds[:n]), cursor)
        counts.update(marks_of_seed(seed))


def test_the_balanced_choice_is_the_lowest_seed_of_the_rarest_mark():
    counts = Counter(dict.fromkeys(MARKS, 3))
    counts["replica_lag"] = 0
    seed = next_seed(counts, set(), 97000)
    assert "replica_lag" in marks_of_seed(seed)
    assert not any("replica_lag" in marks_of_seed(s) for s in range(97000, seed))
    assert next_seed(counts, {seed}, 97000) > seed  # a seed already run is passed over


def test_sixty_balanced_seeds_draw_every_mark_five_times_and_no_seed_twice():
    soak = BalancedSeeds(97000)
    seeds = list(islice(soak, 60))
    assert len(set(seeds)) == 60
    assert soak.counts == tally(draw(seed) for seed in seeds)
    short = {mark: n for mark, n in soak.counts.items() if n < 5}
    assert not short, short


def test_the_page_counts_the_newer_kinds_drawn(tmp_path: Path):
    rows = [
        Row(seed=1, ended_at=1.0, elapsed_s=1.0, messages=1, marks=("chord", "replica_lag")),
        Row(seed=2, ended_at=2.0, elapsed_s=1.0, messages=1, marks=("chord",)),
    ]
    page = write_report(tmp_path / "report.html", rows, 0.0).read_text()
    assert "<h2>Newer kinds drawn</h2>" in page
    assert "<td>chord</td><td>2</td>" in page
    assert "<td>replica_lag</td><td>1</td>" in page
    assert "<td>broker_replace</td><td>0</td>" in page


def test_the_cli_balances_its_seeds_unless_told_in_order():
    from celery_beetle.testing.explorer.cli import _args, _seeds

    balanced = list(_seeds(_args(["--seeds", "6", "--first", "97000"])))
    assert balanced == list(islice(BalancedSeeds(97000), 6))
    in_order = list(_seeds(_args(["--seeds", "6", "--first", "97000", "--in-order"])))
    assert in_order == list(range(97000, 97006))
    assert list(_seeds(_args(["--seed", "97040"]))) == [97040]
