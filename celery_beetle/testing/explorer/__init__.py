"""The fault explorer: random workloads, settings and fault schedules on real
servers, judged by the audit and an effect ledger; every failure replayable from its seed.

- :mod:`.scenario`: a scenario drawn from a seed (workload, settings, faults);
  :mod:`.previous`: the previous release a worker slot may run;
- :mod:`.app`: the tasks the workers run; :mod:`.ledger`: what their bodies did;
- :mod:`.run`: one scenario's servers, workers and relay; :mod:`.runner`: a run from
  start to verdict; :mod:`.faults`: the nemesis; :mod:`.publish`: the publisher;
  :mod:`.relay`: the outbox relay;
- :mod:`.allowed`: what each setting allows (the one table, from the README);
- :mod:`.checker`: the verdict; :mod:`.shrink`: a smaller failing scenario and its test;
- :mod:`.cli`: ``scripts/explore``; :mod:`.coverage`: the newer kinds a soak draws, and
  the balanced soak's choice of seeds; :mod:`.report`: the soak's page.
"""
