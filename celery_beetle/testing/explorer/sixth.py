"""The draw's sixth version: a Sentinel-managed Redis, tracing off, a broker replaced empty.

Drawn from a stream of its own (``Random(f"{seed}/6")``), after the fifth, so a seed keeps
everything the earlier versions gave it:

- in a fifth of the scenarios the dedup store is a **Sentinel-managed** master with one
  replica (:class:`~celery_beetle.testing.sentinel.SentinelSet`), with
  ``beetle_redis_wait_replicas = 1`` in half of those; then most draw a
  ``redis_failover`` (the master killed -9, the Sentinel promotes the replica, the old
  master comes back as a replica ``duration_s`` later; before the kill the replica may be
  cut off for ``lag_s`` while the master acknowledges writes: a lagging replica), and with
  ``wait_replicas`` half draw a ``replica_lag`` (the replica frozen, SIGSTOP, for
  ``duration_s``: every write waits for it and counts as not stored);
- in a fifth of the scenarios with two or more workers, the first worker slot runs with
  **tracing off** (``untraced``): its messages are judged by the effect ledger and the
  brokers alone;
- now and then a ``broker_replace``: a broker killed -9, its data wiped, and an empty node
  started on its port ``duration_s`` later (an operator recreates the vhost, as a
  definitions import would; the workers and publishers declare the queues again). Not
  with a migration, a broker destroyed for good or a queue bound (each reads what the
  node held);
- in about one scenario in seven with two or more workers, the last worker slot runs the
  **previous release** (``previous``, :mod:`.previous`) until a ``worker_upgrade`` stops
  it warmly and starts the current code in its place (a rolling deploy's step).
"""

from __future__ import annotations

import random
from dataclasses import replace

from celery_beetle.testing.explorer.scenario import Fault, Settings

__all__ = ["previous_release", "sixth_faults", "sixth_settings"]


def sixth_settings(rng: random.Random, settings: Settings, faults: tuple[Fault, ...]) -> Settings:
    """A Sentinel-managed Redis in a fifth of the scenarios (``wait_replicas`` in half of
    those); the first worker slot untraced in a fifth of those with two or more workers."""
    sentinel = rng.random() < 0.2
    wait = 1 if sentinel and rng.random() < 0.5 else 0
    untraced = 1 if settings.workers >= 2 and rng.random() < 0.2 else 0
    return replace(settings, sentinel=sentinel, wait_replicas=wait, untraced=untraced)


def sixth_faults(
    rng: random.Random, settings: Settings, faults: tuple[Fault, ...], publish_s: float
) -> tuple[Fault, ...]:
    """A failover (most Sentinel scenarios), a frozen replica (half of those that wait for
    it), a broker replaced by an empty node (about one scenario in eight, where it applies)."""
    added: list[Fault] = []

    def at(end: float) -> float:
        return round(rng.uniform(0.5, end), 1)

    if settings.sentinel and rng.random() < 0.8:
        lag = rng.choice([0.0, 0.0, 0.5, 1.5])
        added.append(
            Fault(at(publish_s + 2), "redis_failover", 0, round(rng.uniform(0.5, 4), 1), lag_s=lag)
        )
    if settings.wait_replicas and rng.random() < 0.5:
        added.append(Fault(at(publish_s + 2), "replica_lag", 0, round(rng.uniform(0.5, 4), 1)))
    kinds = {f.kind for f in faults}
    excluded = {"migrate", "broker_destroy", "queues_bound"}
    if not kinds & excluded and rng.random() < 0.12:
        target = rng.randint(0, settings.brokers - 1)
        # early: an empty node takes seconds to boot, and should still get publishes after
        when = at(max(1.0, publish_s - 6))
        added.append(Fault(when, "broker_replace", target, round(rng.uniform(0.5, 3), 1)))
    return tuple(sorted((*faults, *added), key=lambda f: f.at_s))


def previous_release(
    rng: random.Random, settings: Settings, faults: tuple[Fault, ...], publish_s: float
) -> tuple[Settings, tuple[Fault, ...]]:
    """The last worker slot on the previous release, replaced by the current code during
    the run, in about one scenario in seven with two or more workers (drawn after the
    rest of the version, so a seed keeps what the version gave it before)."""
    if settings.workers < 2 or rng.random() >= 0.15:
        return settings, faults
    upgrade = Fault(round(rng.uniform(1, publish_s + 4), 1), "worker_upgrade", 0, 1.0)
    ordered = tuple(sorted((*faults, upgrade), key=lambda f: f.at_s))
    return replace(settings, previous=True), ordered
