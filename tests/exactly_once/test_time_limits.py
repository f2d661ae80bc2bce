"""Time limits at the defaults: a body ended by its soft or hard limit never loses its message.

The limits come from the lease (``timeout``); at the defaults (one attempt, no exception
retried) a run its limit ended is dead-lettered with the reason, whether the message has one
copy (a one-broker URL, or a publish while the other broker is down) or two. Celery before
5.7 acks a body its hard limit ended; the message must come back all the same.
"""

from __future__ import annotations

import pytest

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import celery_queue_empty, take_dead_letters

#: a 2 s lease: soft limit 1 s, hard 1.5 s; attempts, exceptions and backoff at the defaults
LEASE_ONLY = {
    "timeout": 2,
    "attempts": None,
    "exceptions": None,
    "retry_delay": None,
    "max_delay": None,
}


def _dead_letter_headers(brokers) -> list[dict]:
    return [h for hs in take_dead_letters(brokers, ack=False).values() for h in hs]


@pytest.mark.parametrize("copies", [1, 2], ids=["one-copy", "two-copies"])
def test_a_body_ended_by_its_hard_time_limit_is_dead_lettered_not_acked_away(
    brokers, client, eo_worker, copies
):
    app = client(url=brokers.url_for(*range(copies)), task_options=LEASE_ONLY)
    worker = eo_worker(task_options=LEASE_ONLY, pool="prefork", concurrency=1)
    app.tasks["eo.stubborn"].delay(7, 4)
    assert wait_until(lambda: len(_dead_letter_headers(brokers)) == 1, timeout=40), (
        "the message its hard time limit ended was dead-lettered, not acked away"
    )
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=15)
    assert counts([worker], "start") == {7: 1}, "one attempt: the body began once"
    assert counts([worker])[7] == 0, "no run finished its body"
    (headers,) = _dead_letter_headers(brokers)
    assert headers["x-beetle-dead-reason"] in {"attempts_limit", "not_retryable"}


@pytest.mark.parametrize("copies", [1, 2], ids=["one-copy", "two-copies"])
def test_a_body_ended_by_its_soft_time_limit_is_dead_lettered_once(
    brokers, client, eo_worker, copies
):
    app = client(url=brokers.url_for(*range(copies)), task_options=LEASE_ONLY)
    worker = eo_worker(task_options=LEASE_ONLY, pool="prefork", concurrency=1)
    app.tasks["eo.record"].delay(8, 4)
    assert wait_until(lambda: len(_dead_letter_headers(brokers)) == 1, timeout=40)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=15)
    assert counts([worker], "start") == {8: 1}
    (headers,) = _dead_letter_headers(brokers)
    # the failure is stored in the half second between the soft and the hard limit; on a
    # loaded machine the hard limit may end that too, and the next claim gives up instead
    assert headers["x-beetle-dead-exception"].rsplit(".", 1)[-1] in {
        "SoftTimeLimitExceeded",
        "AttemptsExhausted",
    }
