"""Regression test for scripts/explore --seed 95162: it broke lost, leftover and audit.

RabbitMQ 4's limits with a 5 s consumer timeout under the solo pool: a 9 s body held the
event loop, both brokers closed the consuming channel while Celery's ``basic.qos`` waited,
and the worker stopped on the error. Replays the whole seed on real servers (about a minute).
"""

from __future__ import annotations

import pytest

from tests.explorer.replay import replay

pytestmark = pytest.mark.explorer


def test_seed_95162_runs_without_a_violation(explorer_cluster, tmp_path):
    replay(explorer_cluster, 95162, tmp_path)
