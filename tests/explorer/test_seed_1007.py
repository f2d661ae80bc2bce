"""Regression test written by the fault explorer (shrunk from
scripts/explore --seed 1007): it broke
audit, lost, success_dead. Replays the shrunk scenario on real servers."""

from __future__ import annotations

import pytest

from tests.explorer.replay import replay

SEED = 1007
SCENARIO = """
{
 "faults": [],
 "items": [
  {
   "at_s": 0.0,
   "countdown_s": 11.2,
   "index": 0,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.998
  },
  {
   "at_s": 0.08,
   "countdown_s": 0.0,
   "index": 1,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.018
  },
  {
   "at_s": 0.16,
   "countdown_s": 6.2,
   "index": 2,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.063
  },
  {
   "at_s": 0.82,
   "countdown_s": 0.0,
   "index": 10,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.011
  },
  {
   "at_s": 0.99,
   "countdown_s": 0.0,
   "index": 12,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.017
  },
  {
   "at_s": 1.15,
   "countdown_s": 11.5,
   "index": 14,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.013
  },
  {
   "at_s": 1.81,
   "countdown_s": 0.0,
   "index": 22,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.245
  },
  {
   "at_s": 1.97,
   "countdown_s": 0.0,
   "index": 24,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.017
  },
  {
   "at_s": 2.14,
   "countdown_s": 0.0,
   "index": 26,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.634
  },
  {
   "at_s": 2.63,
   "countdown_s": 0.0,
   "index": 32,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.743
  },
  {
   "at_s": 2.88,
   "countdown_s": 0.0,
   "index": 35,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.005
  },
  {
   "at_s": 3.29,
   "countdown_s": 9.5,
   "index": 40,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.538
  },
  {
   "at_s": 3.95,
   "countdown_s": 14.9,
   "index": 48,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.799
  },
  {
   "at_s": 4.61,
   "countdown_s": 0.0,
   "index": 56,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.109
  },
  {
   "at_s": 5.27,
   "countdown_s": 0.0,
   "index": 64,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.11
  },
  {
   "at_s": 5.92,
   "countdown_s": 0.0,
   "index": 72,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.007
  },
  {
   "at_s": 6.58,
   "countdown_s": 0.0,
   "index": 80,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.349
  },
  {
   "at_s": 7.24,
   "countdown_s": 8.3,
   "index": 88,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 1.012
  }
 ],
 "seed": 1007,
 "settings": {
  "acks_late": false,
  "attempts": 3,
  "brokers": 2,
  "concurrency": 1,
  "exceptions": 1,
  "inbox": false,
  "pool": "solo",
  "prefetch_multiplier": 4,
  "timeout_s": 4.0,
  "workers": 2
 }
}
"""


@pytest.mark.explorer
def test_seed_1007_replays_without_a_violation(explorer_cluster, tmp_path):
    replay(explorer_cluster, SCENARIO, tmp_path)
