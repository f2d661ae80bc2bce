"""BeetleTask keeps Celery's task semantics: an expired task gets a state a waiting caller
reads, and ``self.replace`` runs its replacement (issue #26).

Every task of the app is a BeetleTask by default (``task_cls``), options at their defaults,
on two real brokers with a Redis result backend: what a team gets by changing the base class.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from celery.exceptions import TaskRevokedError

from celery_beetle.testing.waiting import wait_until

pytestmark = pytest.mark.integration

RESULT_TIMEOUT_S = 30
#: sleeping tasks that fill the worker's prefetch window (two pool processes, four each)
FILL = 8


def _queued(brokers) -> int:
    """Messages of the queue over every broker, ready or unacked."""
    depths = [node.get("celery", (0, 0)) for node in brokers.queue_depths()]
    return sum(ready + unacked for ready, unacked in depths)


def test_a_task_that_replaces_itself_returns_its_replacements_result_each_body_once(
    beetle_semantics,
):
    app = beetle_semantics.app
    result = app.tasks["sem.replaced_by_add"].delay(2, 3)
    assert result.get(timeout=RESULT_TIMEOUT_S) == 5
    time.sleep(1)  # a second run of either body would show by now
    assert beetle_semantics.runs() == Counter({"replaced_by_add": 1, "add": 1})


def test_a_replacement_that_replaces_itself_again_completes(beetle_semantics):
    app = beetle_semantics.app
    result = app.tasks["sem.replaced_twice"].delay(4, 5)
    assert result.get(timeout=RESULT_TIMEOUT_S) == 9
    time.sleep(1)
    assert beetle_semantics.runs() == Counter({"replaced_twice": 1, "replaced_by_add": 1, "add": 1})


def test_an_expired_task_is_revoked_once_for_its_waiting_caller_and_never_runs(
    beetle_semantics, brokers
):
    app = beetle_semantics.app
    past = datetime.now(timezone.utc) - timedelta(seconds=5)
    result = app.tasks["sem.add"].apply_async((1, 2), expires=past)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=RESULT_TIMEOUT_S)
    assert result.state == "REVOKED"
    # decided once: the twin copy is dropped, not revoked (and stored) a second time
    assert wait_until(lambda: _queued(brokers) == 0, timeout=20)
    assert beetle_semantics.worker_log().count("Discarding revoked task") == 1
    assert beetle_semantics.runs() == Counter()


@pytest.mark.parametrize("expires", ["seconds", "datetime"])
def test_a_task_that_expires_while_waiting_in_the_worker_is_revoked_once_for_its_caller(
    beetle_semantics, brokers, expires
):
    """Celery's own ``test_expired``: sleeping tasks fill the worker's prefetch window, and
    a task that expires while it waits behind them in its queue is ``REVOKED`` for its
    caller, whose ``get()`` raises ``TaskRevokedError`` instead of waiting forever (a broker
    that expired the message itself would discard it unseen); its body never runs, and the
    twin copy is dropped rather than revoked a second time."""
    app = beetle_semantics.app
    for _ in range(FILL):
        app.tasks["sem.sleeping"].delay(2)
    when = 1 if expires == "seconds" else datetime.now(timezone.utc) + timedelta(seconds=1)
    result = app.tasks["sem.add"].apply_async((1, 1), expires=when)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=RESULT_TIMEOUT_S)
    assert result.state == "REVOKED"
    assert wait_until(lambda: _queued(brokers) == 0, timeout=RESULT_TIMEOUT_S)
    assert beetle_semantics.worker_log().count("Discarding revoked task") == 1
    assert beetle_semantics.runs() == Counter({"sleeping": FILL})


def test_a_dead_lettered_task_ends_its_callers_wait_with_failure_and_the_reason_once(
    beetle_semantics, brokers
):
    """At the defaults a body that raises is dead-lettered at once (``attempts=1``): the
    caller's ``get()`` raises the body's exception, the state is FAILURE, the message waits
    in ``celery.dead``, and the twin copy neither runs nor stores a second outcome."""
    app = beetle_semantics.app
    result = app.tasks["sem.fail"].delay(7)
    with pytest.raises(ValueError, match="fail 7"):
        result.get(timeout=RESULT_TIMEOUT_S)
    assert result.state == "FAILURE"
    assert wait_until(lambda: _queued(brokers) == 0, timeout=20)
    assert beetle_semantics.runs() == Counter({"fail": 1})
    dead = [depths.get("celery.dead", (0, 0)) for depths in brokers.queue_depths()]
    assert sum(ready for ready, _ in dead) >= 1, dead
    assert beetle_semantics.worker_log().count("raised unexpected: ValueError('fail 7')") == 1
