"""Under prefork a pool process waits for Redis at most a tenth of the soft limit before
handing the delivery back to the gate, which waits without a pool slot (the fault
explorer's seed 5029); the wait is not taken from the body's limits (test_time_limits)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from celery_beetle.worker import run_calls


def _window(soft: float | None, message_soft: float | None = None) -> float:
    task = SimpleNamespace(soft_time_limit=soft)
    request = SimpleNamespace(timelimit=(None, message_soft))
    return run_calls.retry_window(task, request)


@pytest.fixture
def pool_process(monkeypatch):
    monkeypatch.setattr(
        run_calls, "current_process", lambda: SimpleNamespace(name="ForkPoolWorker-1")
    )


def test_a_short_soft_limit_shortens_the_pools_wait_for_the_store(pool_process):
    assert _window(3.0) == pytest.approx(0.3)
    assert _window(270.0, message_soft=1.0) == pytest.approx(0.1)


def test_a_long_soft_limit_or_none_keeps_the_usual_wait(pool_process):
    assert _window(270.0) == run_calls.CLAIM_RETRY_S
    assert _window(None) == run_calls.CLAIM_RETRY_S


def test_pools_in_the_main_process_keep_the_usual_wait(monkeypatch):
    monkeypatch.setattr(run_calls, "current_process", lambda: SimpleNamespace(name="MainProcess"))
    assert _window(3.0) == run_calls.CLAIM_RETRY_S
