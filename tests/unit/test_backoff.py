"""Retry delays: doubling from the base delay, capped, the same for every worker."""

from __future__ import annotations

from celery_beetle.store.backoff import backoff_ms


def test_first_failure_waits_the_base_delay():
    assert backoff_ms(1, 10_000, 600_000) == 10_000


def test_each_further_failure_doubles_the_wait():
    assert [backoff_ms(n, 10_000, 600_000) for n in (1, 2, 3, 4)] == [
        10_000,
        20_000,
        40_000,
        80_000,
    ]


def test_the_wait_never_exceeds_max_delay():
    assert backoff_ms(7, 10_000, 600_000) == 600_000


def test_a_thousandth_failure_waits_max_delay_without_building_huge_numbers():
    assert backoff_ms(1_000, 10_000, 600_000) == 600_000


def test_zero_delay_retries_at_once():
    assert backoff_ms(5, 0, 600_000) == 0


def test_no_failure_means_no_wait():
    assert backoff_ms(0, 10_000, 600_000) == 0
