"""Regression test written by the fault explorer (shrunk from
scripts/explore --seed 2180): it broke
dead_never_started, lost. Replays the shrunk scenario on real servers."""

from __future__ import annotations

import pytest

from tests.explorer.replay import replay

SEED = 2180
SCENARIO = """
{
 "faults": [
  {
   "at_s": 8.6,
   "duration_s": 1.3,
   "kind": "migrate",
   "target": 2
  },
  {
   "at_s": 10.0,
   "duration_s": 3.1,
   "kind": "broker_kill",
   "target": 1
  }
 ],
 "items": [
  {
   "at_s": 0.0,
   "countdown_s": 0.0,
   "index": 0,
   "kind": "work",
   "mode": "overrun",
   "sleep_s": 1.029
  },
  {
   "at_s": 0.06,
   "countdown_s": 0.0,
   "index": 1,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.259
  },
  {
   "at_s": 0.12,
   "countdown_s": 0.0,
   "index": 2,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.074
  },
  {
   "at_s": 0.19,
   "countdown_s": 7.0,
   "index": 3,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.011
  },
  {
   "at_s": 0.25,
   "countdown_s": 0.0,
   "index": 4,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.056
  },
  {
   "at_s": 0.31,
   "countdown_s": 0.0,
   "index": 5,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.158
  },
  {
   "at_s": 0.37,
   "countdown_s": 0.0,
   "index": 6,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.069
  },
  {
   "at_s": 0.44,
   "countdown_s": 0.0,
   "index": 7,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.093
  },
  {
   "at_s": 0.5,
   "countdown_s": 0.0,
   "index": 8,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.05
  },
  {
   "at_s": 0.56,
   "countdown_s": 0.0,
   "index": 9,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.121
  },
  {
   "at_s": 0.62,
   "countdown_s": 0.0,
   "index": 10,
   "kind": "work",
   "mode": "overrun",
   "sleep_s": 0.292
  },
  {
   "at_s": 0.69,
   "countdown_s": 14.1,
   "index": 11,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.089
  },
  {
   "at_s": 0.75,
   "countdown_s": 9.6,
   "index": 12,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.809
  },
  {
   "at_s": 0.81,
   "countdown_s": 0.0,
   "index": 13,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.018
  },
  {
   "at_s": 0.87,
   "countdown_s": 0.0,
   "index": 14,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.007
  },
  {
   "at_s": 0.93,
   "countdown_s": 0.0,
   "index": 15,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.008
  },
  {
   "at_s": 1.0,
   "countdown_s": 12.5,
   "index": 16,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.289
  },
  {
   "at_s": 1.06,
   "countdown_s": 11.4,
   "index": 17,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.017
  },
  {
   "at_s": 1.12,
   "countdown_s": 4.2,
   "index": 18,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 1.127
  },
  {
   "at_s": 1.18,
   "countdown_s": 3.8,
   "index": 19,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 1.181
  },
  {
   "at_s": 1.25,
   "countdown_s": 9.5,
   "index": 20,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.087
  },
  {
   "at_s": 1.31,
   "countdown_s": 0.0,
   "index": 21,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.078
  },
  {
   "at_s": 1.37,
   "countdown_s": 2.3,
   "index": 22,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 1.032
  },
  {
   "at_s": 1.43,
   "countdown_s": 0.0,
   "index": 23,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.012
  },
  {
   "at_s": 1.5,
   "countdown_s": 0.0,
   "index": 24,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.061
  },
  {
   "at_s": 1.56,
   "countdown_s": 3.7,
   "index": 25,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.081
  },
  {
   "at_s": 1.62,
   "countdown_s": 3.3,
   "index": 26,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.049
  },
  {
   "at_s": 1.68,
   "countdown_s": 0.0,
   "index": 27,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.869
  },
  {
   "at_s": 1.74,
   "countdown_s": 0.0,
   "index": 28,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 1.073
  },
  {
   "at_s": 1.81,
   "countdown_s": 4.9,
   "index": 29,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.342
  },
  {
   "at_s": 1.82,
   "countdown_s": 0.0,
   "index": 113,
   "kind": "bad",
   "mode": "no_message_id",
   "sleep_s": 0.0
  },
  {
   "at_s": 1.87,
   "countdown_s": 13.1,
   "index": 30,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.026
  },
  {
   "at_s": 1.93,
   "countdown_s": 0.0,
   "index": 31,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.087
  },
  {
   "at_s": 1.99,
   "countdown_s": 0.0,
   "index": 32,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.227
  },
  {
   "at_s": 2.06,
   "countdown_s": 9.1,
   "index": 33,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.027
  },
  {
   "at_s": 2.12,
   "countdown_s": 14.3,
   "index": 34,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.04
  },
  {
   "at_s": 2.18,
   "countdown_s": 0.0,
   "index": 35,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.289
  },
  {
   "at_s": 2.24,
   "countdown_s": 0.0,
   "index": 36,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.028
  },
  {
   "at_s": 2.31,
   "countdown_s": 0.0,
   "index": 37,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 1.136
  },
  {
   "at_s": 2.37,
   "countdown_s": 11.4,
   "index": 38,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.025
  },
  {
   "at_s": 2.43,
   "countdown_s": 8.8,
   "index": 39,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.0
  },
  {
   "at_s": 2.49,
   "countdown_s": 0.0,
   "index": 40,
   "kind": "work",
   "mode": "overrun",
   "sleep_s": 0.078
  },
  {
   "at_s": 2.55,
   "countdown_s": 0.0,
   "index": 41,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.918
  },
  {
   "at_s": 2.62,
   "countdown_s": 0.0,
   "index": 42,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.082
  },
  {
   "at_s": 2.68,
   "countdown_s": 5.0,
   "index": 43,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.005
  },
  {
   "at_s": 2.74,
   "countdown_s": 0.0,
   "index": 44,
   "kind": "work",
   "mode": "overrun",
   "sleep_s": 1.132
  },
  {
   "at_s": 2.8,
   "countdown_s": 0.0,
   "index": 45,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.001
  },
  {
   "at_s": 2.87,
   "countdown_s": 0.0,
   "index": 46,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.013
  },
  {
   "at_s": 2.93,
   "countdown_s": 0.0,
   "index": 47,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.017
  },
  {
   "at_s": 2.93,
   "countdown_s": 0.0,
   "index": 112,
   "kind": "bad",
   "mode": "no_message_id",
   "sleep_s": 0.0
  },
  {
   "at_s": 2.99,
   "countdown_s": 4.7,
   "index": 48,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.019
  },
  {
   "at_s": 3.05,
   "countdown_s": 0.0,
   "index": 49,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.079
  },
  {
   "at_s": 3.12,
   "countdown_s": 0.0,
   "index": 50,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.097
  },
  {
   "at_s": 3.18,
   "countdown_s": 9.6,
   "index": 51,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.007
  },
  {
   "at_s": 3.24,
   "countdown_s": 0.0,
   "index": 52,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.013
  },
  {
   "at_s": 3.3,
   "countdown_s": 0.0,
   "index": 53,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.098
  },
  {
   "at_s": 3.36,
   "countdown_s": 0.0,
   "index": 54,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.008
  },
  {
   "at_s": 3.43,
   "countdown_s": 11.5,
   "index": 55,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.117
  },
  {
   "at_s": 3.49,
   "countdown_s": 7.3,
   "index": 56,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.185
  },
  {
   "at_s": 3.55,
   "countdown_s": 0.0,
   "index": 57,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.019
  },
  {
   "at_s": 3.61,
   "countdown_s": 0.0,
   "index": 58,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.002
  },
  {
   "at_s": 3.68,
   "countdown_s": 0.0,
   "index": 59,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.246
  },
  {
   "at_s": 3.74,
   "countdown_s": 0.0,
   "index": 60,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.347
  },
  {
   "at_s": 3.8,
   "countdown_s": 0.0,
   "index": 61,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.011
  },
  {
   "at_s": 3.86,
   "countdown_s": 7.9,
   "index": 62,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.374
  },
  {
   "at_s": 3.93,
   "countdown_s": 0.0,
   "index": 63,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.002
  },
  {
   "at_s": 3.99,
   "countdown_s": 0.0,
   "index": 64,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.011
  },
  {
   "at_s": 4.05,
   "countdown_s": 0.0,
   "index": 65,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.046
  },
  {
   "at_s": 4.11,
   "countdown_s": 0.0,
   "index": 66,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.115
  },
  {
   "at_s": 4.17,
   "countdown_s": 10.8,
   "index": 67,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.385
  },
  {
   "at_s": 4.24,
   "countdown_s": 0.0,
   "index": 68,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.152
  },
  {
   "at_s": 4.3,
   "countdown_s": 2.3,
   "index": 69,
   "kind": "work",
   "mode": "overrun",
   "sleep_s": 0.007
  },
  {
   "at_s": 4.36,
   "countdown_s": 8.9,
   "index": 70,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.002
  },
  {
   "at_s": 4.42,
   "countdown_s": 0.0,
   "index": 71,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.001
  },
  {
   "at_s": 4.49,
   "countdown_s": 0.0,
   "index": 72,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.153
  },
  {
   "at_s": 4.55,
   "countdown_s": 0.0,
   "index": 73,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.01
  },
  {
   "at_s": 4.61,
   "countdown_s": 4.5,
   "index": 74,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.227
  },
  {
   "at_s": 4.64,
   "countdown_s": 0.0,
   "index": 114,
   "kind": "bad",
   "mode": "undecodable",
   "sleep_s": 0.0
  },
  {
   "at_s": 4.67,
   "countdown_s": 11.6,
   "index": 75,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.217
  },
  {
   "at_s": 4.74,
   "countdown_s": 0.0,
   "index": 76,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.02
  },
  {
   "at_s": 4.8,
   "countdown_s": 0.0,
   "index": 77,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.4
  },
  {
   "at_s": 4.86,
   "countdown_s": 0.0,
   "index": 78,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.012
  },
  {
   "at_s": 4.92,
   "countdown_s": 0.0,
   "index": 79,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.008
  },
  {
   "at_s": 4.98,
   "countdown_s": 3.4,
   "index": 80,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.482
  },
  {
   "at_s": 5.05,
   "countdown_s": 0.0,
   "index": 81,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.062
  },
  {
   "at_s": 5.11,
   "countdown_s": 2.4,
   "index": 82,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.097
  },
  {
   "at_s": 5.17,
   "countdown_s": 0.0,
   "index": 83,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.007
  },
  {
   "at_s": 5.23,
   "countdown_s": 0.0,
   "index": 84,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.332
  },
  {
   "at_s": 5.3,
   "countdown_s": 0.0,
   "index": 85,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.013
  },
  {
   "at_s": 5.36,
   "countdown_s": 0.0,
   "index": 86,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.224
  },
  {
   "at_s": 5.42,
   "countdown_s": 0.0,
   "index": 87,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.958
  },
  {
   "at_s": 5.48,
   "countdown_s": 0.0,
   "index": 88,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.005
  },
  {
   "at_s": 5.55,
   "countdown_s": 11.7,
   "index": 89,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.002
  },
  {
   "at_s": 5.61,
   "countdown_s": 4.0,
   "index": 90,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.298
  },
  {
   "at_s": 5.67,
   "countdown_s": 0.0,
   "index": 91,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.046
  },
  {
   "at_s": 5.73,
   "countdown_s": 0.0,
   "index": 92,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.029
  },
  {
   "at_s": 5.79,
   "countdown_s": 7.7,
   "index": 93,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.012
  },
  {
   "at_s": 5.86,
   "countdown_s": 9.2,
   "index": 94,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 1.134
  },
  {
   "at_s": 5.92,
   "countdown_s": 0.0,
   "index": 95,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.25
  },
  {
   "at_s": 5.98,
   "countdown_s": 0.0,
   "index": 96,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.018
  },
  {
   "at_s": 6.04,
   "countdown_s": 0.0,
   "index": 97,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.126
  },
  {
   "at_s": 6.11,
   "countdown_s": 0.0,
   "index": 98,
   "kind": "work",
   "mode": "fail",
   "sleep_s": 0.017
  },
  {
   "at_s": 6.17,
   "countdown_s": 0.0,
   "index": 99,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.044
  },
  {
   "at_s": 6.23,
   "countdown_s": 0.0,
   "index": 100,
   "kind": "work",
   "mode": "long",
   "sleep_s": 0.006
  },
  {
   "at_s": 6.29,
   "countdown_s": 0.0,
   "index": 101,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.086
  },
  {
   "at_s": 6.36,
   "countdown_s": 12.1,
   "index": 102,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.169
  },
  {
   "at_s": 6.42,
   "countdown_s": 2.6,
   "index": 103,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.353
  },
  {
   "at_s": 6.48,
   "countdown_s": 14.1,
   "index": 104,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.318
  },
  {
   "at_s": 6.54,
   "countdown_s": 9.0,
   "index": 105,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 1.163
  },
  {
   "at_s": 6.6,
   "countdown_s": 0.0,
   "index": 106,
   "kind": "plain",
   "mode": "ok",
   "sleep_s": 0.23
  },
  {
   "at_s": 6.67,
   "countdown_s": 0.0,
   "index": 107,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.022
  },
  {
   "at_s": 6.73,
   "countdown_s": 0.0,
   "index": 108,
   "kind": "work",
   "mode": "ok",
   "sleep_s": 0.075
  },
  {
   "at_s": 6.79,
   "countdown_s": 12.1,
   "index": 109,
   "kind": "work",
   "mode": "flaky",
   "sleep_s": 0.005
  },
  {
   "at_s": 6.85,
   "countdown_s": 0.0,
   "index": 110,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.222
  },
  {
   "at_s": 6.92,
   "countdown_s": 0.0,
   "index": 111,
   "kind": "work",
   "mode": "fatal",
   "sleep_s": 0.082
  }
 ],
 "seed": 2180,
 "settings": {
  "acks_late": null,
  "attempts": 1,
  "brokers": 2,
  "concurrency": 3,
  "exceptions": 0,
  "inbox": false,
  "pool": "threads",
  "prefetch_multiplier": 4,
  "timeout_s": 10.0,
  "workers": 2
 }
}
"""


@pytest.mark.explorer
def test_seed_2180_replays_without_a_violation(explorer_cluster, tmp_path):
    replay(explorer_cluster, SCENARIO, tmp_path)
