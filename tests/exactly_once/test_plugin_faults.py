"""The plugin's other fault helpers, on this package's test app: a frozen broker, a dedup
Redis that refuses writes, a broker killed for good; each task still runs exactly once.

Together with the first two tests of test_faults.py and examples/user_project, these are
what keeps celery_beetle.pytest_plugin working: its fixtures, its faults and its verdict.
"""

from __future__ import annotations

import time

import pytest

from celery_beetle.testing.verdict import ExactlyOnceError


@pytest.fixture
def beetle_app_path() -> str:
    return "tests.exactly_once.app:app"


def test_a_frozen_broker_and_a_store_refusing_writes_cost_no_run_and_add_none(beetle_setup):
    record = beetle_setup.app.tasks["eo.record"]
    for item in range(10):
        record.delay(item)
    broker = beetle_setup.broker_cluster[1]
    broker.freeze()  # SIGSTOP: sockets open, nothing answers, past the confirm timeout
    for item in range(10, 15):
        record.delay(item)
    assert not broker.ready()
    broker.thaw()
    with beetle_setup.backend.refusing_writes():  # every claim fails with OOM for a while
        for item in range(15, 20):
            record.delay(item)
        time.sleep(2)
    verdict = beetle_setup.assert_exactly_once(expected=20)
    assert verdict.counts["duplicated"] == verdict.counts["lost"] == 0


def test_the_verdict_names_a_message_published_while_no_worker_ran(beetle_setup):
    beetle_setup.worker.kill()
    beetle_setup.app.tasks["eo.record"].delay(1)
    with pytest.raises(ExactlyOnceError, match=r"1 lost: celery/") as info:
        beetle_setup.assert_exactly_once(expected=1, timeout=2)
    assert len(info.value.verdict.ids["lost"]) == 1
