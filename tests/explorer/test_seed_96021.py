"""Regression test for scripts/explore --seed 96021: it broke lost and audit.

A migration to quorum began while a Sentinel failed over (``wait_replicas`` set): the
command stopped with its state saved ("No master found"), and the workers held the queue
handed back for 240 s, past the drain. The operator's part, ``--resume``, was missing from
the explorer, which now runs a stopped migration again as operations.md says. Replays the
whole seed on real servers (about 70 s, so with ``--soak``).
"""

from __future__ import annotations

import pytest

from tests.explorer.replay import replay

pytestmark = [pytest.mark.explorer, pytest.mark.soak]


def test_seed_96021_runs_without_a_violation(explorer_cluster, tmp_path):
    replay(explorer_cluster, 96021, tmp_path)
