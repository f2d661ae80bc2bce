"""Regression test written by the fault explorer (shrunk from
scripts/explore --seed 1004): it broke
success_dead. Replays the shrunk scenario on real servers."""

from __future__ import annotations

import pytest

from tests.explorer.replay import replay

SEED = 1004
SCENARIO = """
{
 "faults": [
  {
   "at_s": 11.5,
   "duration_s": 2.7,
   "kind": "worker_kill",
   "target": 2
  },
  {
   "at_s": 14.1,
   "duration_s": 3.5,
   "kind": "worker_kill",
   "target": 0
  }
 ],
 "items": [
  {
   "at_s": 0.0,
   "countdown_s": 0.0,
   "index": 0,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.071
  },
  {
   "at_s": 0.55,
   "countdown_s": 0.0,
   "index": 6,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.184
  },
  {
   "at_s": 0.92,
   "countdown_s": 0.0,
   "index": 10,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.014
  },
  {
   "at_s": 1.29,
   "countdown_s": 0.0,
   "index": 14,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.028
  },
  {
   "at_s": 2.02,
   "countdown_s": 0.0,
   "index": 22,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.052
  },
  {
   "at_s": 2.76,
   "countdown_s": 0.0,
   "index": 30,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.629
  },
  {
   "at_s": 3.49,
   "countdown_s": 0.0,
   "index": 38,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.011
  },
  {
   "at_s": 4.23,
   "countdown_s": 0.0,
   "index": 46,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.009
  },
  {
   "at_s": 4.96,
   "countdown_s": 0.0,
   "index": 54,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.009
  },
  {
   "at_s": 5.7,
   "countdown_s": 0.0,
   "index": 62,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.068
  },
  {
   "at_s": 6.43,
   "countdown_s": 0.0,
   "index": 70,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.015
  },
  {
   "at_s": 7.17,
   "countdown_s": 0.0,
   "index": 78,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.016
  },
  {
   "at_s": 7.9,
   "countdown_s": 0.0,
   "index": 86,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.073
  },
  {
   "at_s": 8.64,
   "countdown_s": 0.0,
   "index": 94,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.015
  },
  {
   "at_s": 9.37,
   "countdown_s": 0.0,
   "index": 102,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.869
  },
  {
   "at_s": 9.74,
   "countdown_s": 0.0,
   "index": 106,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.172
  },
  {
   "at_s": 10.11,
   "countdown_s": 0.0,
   "index": 110,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.038
  }
 ],
 "seed": 1004,
 "settings": {
  "acks_late": false,
  "attempts": 1,
  "brokers": 2,
  "concurrency": 1,
  "exceptions": 0,
  "inbox": false,
  "pool": "solo",
  "prefetch_multiplier": 4,
  "timeout_s": 4.0,
  "workers": 2
 }
}
"""


@pytest.mark.explorer
def test_seed_1004_replays_without_a_violation(explorer_cluster, tmp_path):
    replay(explorer_cluster, SCENARIO, tmp_path)
