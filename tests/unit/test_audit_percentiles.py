"""The audit's latency percentiles, read off a histogram of latency → count (pure Python)."""

from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("pyspark")

from celery_beetle.audit.aggregates import _percentiles


def test_a_gap_at_the_median_gives_the_value_at_the_median_rank():
    # half the values fast, half slow: the exact median is the first slow value
    counts = {0: 2496, 5: 1, 120: 2496}
    assert _percentiles(counts, (0.5,)) == [5]
    assert _percentiles({0: 2496, 120: 2497}, (0.5,)) == [120]


def test_each_percentile_is_the_smallest_value_with_enough_values_at_or_below_it():
    rng = random.Random(7)
    values = [rng.randint(0, 5000) for _ in range(10_001)]
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    ordered = sorted(values)
    wanted = (0.5, 0.9, 0.99)
    expected = [ordered[max(1, math.ceil(p * len(values))) - 1] for p in wanted]
    assert _percentiles(counts, wanted) == expected


def test_no_values_give_none_for_every_percentile():
    assert _percentiles({}, (0.5, 0.9, 0.99)) == [None, None, None]
