"""The fault explorer's fixed seeds: about ten minutes of scenarios on real servers, each
failing with the command that replays it. ``--soak`` runs ``SOAK_SEEDS`` more.

On the code before their fixes three of the first six seeds failed (1004 and 1018 with
``acks_late=False``, 1015 a claim counted as a start after a worker SIGKILL), and 1000 found
a plain task run twice after a migration (a refused declaration gave back what a consuming
channel held); on the fixed code all six pass.
"""

from __future__ import annotations

import pytest

from tests.explorer.replay import replay

#: the CI seeds (about 5 minutes in all on a 2-core machine: 30-70 s a scenario), from the
#: first 30-minute soak. (1002, 1013 and 1016 left CI for the suite's
#: time; 1004 left it with an open finding, docs/guides/fault-explorer.md: they run with
#: --soak.)
CI_SEEDS = (1000, 1003, 1005, 1009, 1015, 1018)
#: the draw's sixth version, a seed per kind it added (each under a minute): 96006 a
#: Sentinel failover without wait_replicas after a 1.5 s replica lag; 96179 one with
#: wait_replicas and a frozen replica; 96032 a worker with tracing off; 96046 a worker of
#: the previous release, upgraded during the run; 96127 a broker replaced by an empty node
SIXTH_SEEDS = (96006, 96179, 96032, 96046, 96127)
#: more with --soak; 111002 lost a countdown task with acks_late=False whose copies both
#: came due during a Redis refusal (acked early, then not claimed: now sent back); 110012,
#: on the oldest environment, a worker on Celery 5.3 died handing back a countdown task
SOAK_SEEDS = (1002, 1004, 1013, 1016, 96119, 110012, 111002, *range(100, 140))

pytestmark = pytest.mark.explorer


@pytest.mark.parametrize("seed", CI_SEEDS + SIXTH_SEEDS)
def test_seed_runs_without_a_violation(explorer_cluster, tmp_path, seed):
    replay(explorer_cluster, seed, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("seed", SOAK_SEEDS)
def test_soak_seed_runs_without_a_violation(explorer_cluster, tmp_path, seed):
    replay(explorer_cluster, seed, tmp_path)
