"""Regression test written by the fault explorer (shrunk from
scripts/explore --seed 3022): it broke
success_dead. Replays the shrunk scenario on real servers."""

from __future__ import annotations

import pytest

from tests.explorer.replay import replay

SEED = 3022
SCENARIO = """
{
 "faults": [
  {
   "at_s": 3.5,
   "duration_s": 3.8,
   "kind": "worker_term",
   "target": 1
  },
  {
   "at_s": 7.8,
   "duration_s": 4.6,
   "kind": "redis_partition",
   "target": 2
  }
 ],
 "items": [
  {
   "at_s": 0.0,
   "countdown_s": 0.0,
   "index": 0,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.947
  },
  {
   "at_s": 0.19,
   "countdown_s": 0.0,
   "index": 2,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.002
  },
  {
   "at_s": 0.37,
   "countdown_s": 0.0,
   "index": 4,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.285
  },
  {
   "at_s": 0.54,
   "countdown_s": 0.0,
   "index": 99,
   "kind": "bad",
   "mode": "undecodable",
   "sleep_s": 0.0
  },
  {
   "at_s": 0.65,
   "countdown_s": 0.0,
   "index": 7,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.021
  },
  {
   "at_s": 0.84,
   "countdown_s": 0.0,
   "index": 9,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.294
  },
  {
   "at_s": 1.03,
   "countdown_s": 0.0,
   "index": 11,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.198
  },
  {
   "at_s": 1.21,
   "countdown_s": 0.0,
   "index": 13,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.011
  },
  {
   "at_s": 1.4,
   "countdown_s": 0.0,
   "index": 15,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.086
  },
  {
   "at_s": 1.59,
   "countdown_s": 0.0,
   "index": 17,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.096
  },
  {
   "at_s": 1.77,
   "countdown_s": 0.0,
   "index": 19,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.002
  },
  {
   "at_s": 1.96,
   "countdown_s": 0.0,
   "index": 21,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.26
  },
  {
   "at_s": 2.15,
   "countdown_s": 0.0,
   "index": 23,
   "kind": "work",
   "mode": "overrun",
   "sleep_s": 0.002
  },
  {
   "at_s": 2.24,
   "countdown_s": 0.0,
   "index": 24,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.008
  },
  {
   "at_s": 2.33,
   "countdown_s": 0.0,
   "index": 25,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.029
  },
  {
   "at_s": 2.52,
   "countdown_s": 0.0,
   "index": 27,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.406
  },
  {
   "at_s": 2.71,
   "countdown_s": 0.0,
   "index": 29,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.02
  },
  {
   "at_s": 2.89,
   "countdown_s": 0.0,
   "index": 31,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.075
  },
  {
   "at_s": 3.08,
   "countdown_s": 0.0,
   "index": 33,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.023
  },
  {
   "at_s": 3.2,
   "countdown_s": 0.0,
   "index": 98,
   "kind": "bad",
   "mode": "no_message_id",
   "sleep_s": 0.0
  },
  {
   "at_s": 3.36,
   "countdown_s": 0.0,
   "index": 36,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.086
  },
  {
   "at_s": 3.55,
   "countdown_s": 0.0,
   "index": 38,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.0
  },
  {
   "at_s": 3.73,
   "countdown_s": 0.0,
   "index": 40,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.03
  },
  {
   "at_s": 3.92,
   "countdown_s": 0.0,
   "index": 42,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.028
  },
  {
   "at_s": 4.11,
   "countdown_s": 0.0,
   "index": 44,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.01
  },
  {
   "at_s": 4.24,
   "countdown_s": 0.0,
   "index": 97,
   "kind": "bad",
   "mode": "no_message_id",
   "sleep_s": 0.0
  },
  {
   "at_s": 4.39,
   "countdown_s": 0.0,
   "index": 47,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.258
  },
  {
   "at_s": 4.58,
   "countdown_s": 0.0,
   "index": 49,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.011
  },
  {
   "at_s": 4.76,
   "countdown_s": 0.0,
   "index": 51,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.075
  },
  {
   "at_s": 4.95,
   "countdown_s": 0.0,
   "index": 53,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.05
  },
  {
   "at_s": 5.14,
   "countdown_s": 0.0,
   "index": 55,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.514
  },
  {
   "at_s": 5.32,
   "countdown_s": 0.0,
   "index": 57,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.212
  },
  {
   "at_s": 5.51,
   "countdown_s": 0.0,
   "index": 59,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.008
  },
  {
   "at_s": 5.7,
   "countdown_s": 0.0,
   "index": 61,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.016
  },
  {
   "at_s": 5.88,
   "countdown_s": 0.0,
   "index": 63,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.097
  },
  {
   "at_s": 6.07,
   "countdown_s": 0.0,
   "index": 65,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.139
  },
  {
   "at_s": 6.26,
   "countdown_s": 0.0,
   "index": 67,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.33
  },
  {
   "at_s": 6.44,
   "countdown_s": 0.0,
   "index": 69,
   "kind": "work",
   "mode": "overrun",
   "sleep_s": 0.05
  },
  {
   "at_s": 6.63,
   "countdown_s": 0.0,
   "index": 71,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.035
  },
  {
   "at_s": 6.82,
   "countdown_s": 0.0,
   "index": 73,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.063
  },
  {
   "at_s": 7.0,
   "countdown_s": 0.0,
   "index": 75,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.019
  },
  {
   "at_s": 7.19,
   "countdown_s": 0.0,
   "index": 77,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.929
  },
  {
   "at_s": 7.38,
   "countdown_s": 0.0,
   "index": 79,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.758
  },
  {
   "at_s": 7.56,
   "countdown_s": 0.0,
   "index": 81,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.152
  },
  {
   "at_s": 7.75,
   "countdown_s": 0.0,
   "index": 83,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.099
  },
  {
   "at_s": 7.94,
   "countdown_s": 0.0,
   "index": 85,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.078
  },
  {
   "at_s": 8.12,
   "countdown_s": 0.0,
   "index": 87,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.065
  },
  {
   "at_s": 8.31,
   "countdown_s": 0.0,
   "index": 89,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.006
  },
  {
   "at_s": 8.5,
   "countdown_s": 0.0,
   "index": 91,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 1.173
  },
  {
   "at_s": 8.68,
   "countdown_s": 0.0,
   "index": 93,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.694
  },
  {
   "at_s": 8.87,
   "countdown_s": 0.0,
   "index": 95,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.29
  }
 ],
 "seed": 3022,
 "settings": {
  "acks_late": null,
  "attempts": 1,
  "brokers": 2,
  "concurrency": 1,
  "exceptions": 0,
  "inbox": false,
  "pool": "solo",
  "prefetch_multiplier": 4,
  "timeout_s": 6.0,
  "workers": 2
 }
}
"""


@pytest.mark.explorer
def test_seed_3022_replays_without_a_violation(explorer_cluster, tmp_path):
    replay(explorer_cluster, SCENARIO, tmp_path)
