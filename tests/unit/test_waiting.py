"""Waiting on a system that heals: a deadline, or for as long as work keeps finishing."""

from __future__ import annotations

import itertools
import time

from celery_beetle.testing.waiting import wait_while_progressing


def test_a_wait_goes_on_past_the_stall_time_while_work_keeps_finishing():
    finished = itertools.count()
    began = time.monotonic()
    done = wait_while_progressing(
        lambda: time.monotonic() - began > 0.3, lambda: next(finished), stall=0.1, interval=0.01
    )
    assert done


def test_a_wait_gives_up_once_nothing_has_finished_for_the_stall_time():
    began = time.monotonic()
    done = wait_while_progressing(lambda: False, lambda: 7, stall=0.2, timeout=10, interval=0.01)
    assert not done
    assert 0.2 <= time.monotonic() - began < 2


def test_a_wait_gives_up_at_its_timeout_though_work_keeps_finishing():
    finished = itertools.count()
    began = time.monotonic()
    done = wait_while_progressing(
        lambda: False, lambda: next(finished), stall=5, timeout=0.2, interval=0.01
    )
    assert not done
    assert time.monotonic() - began < 2
