"""What the dedup store costs in Redis: round trips per message and bytes per record.

Beetle's store makes 8-9 separate Redis round trips for a redundant pair (both copies
delivered, the body run once) and 4-5 for each duplicate it drops, with no atomicity; ours
makes one read in the gate and one script per state change. This prints the measured numbers
against the targets of ``design.md``:

- round trips for a redundant pair: gate read of copy 1, claim, complete, gate read of
  copy 2 (target <= 4);
- round trips per dropped duplicate (target <= 1);
- Redis memory per in-flight (claimed, running) message, ``MEMORY USAGE`` averaged over
  10,000 records (target <= 300 bytes); completed records and the server's own memory
  growth per record (which includes the expiry entry) are shown too.

Round trips are counted twice: by the store's ``round_trips`` counter, and on the wire by a
connection class that counts the requests redis-py sends, so a hidden extra trip (such as
reloading a script) would show.

Usage::

    python -m benchmarks.bench_store [--messages 10000]

Uses ``BEETLE_REDIS_URL`` if set (only keys under ``beetle-bench:`` are written, and deleted
afterwards); otherwise starts a throwaway ``redis-server`` on a free port.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from celery_beetle.store import RedisStore
from celery_beetle.store.outcome import Gate, Limits
from celery_beetle.store.state import MessageFacts

PREFIX = "beetle-bench:"
DAY_MS = 86_400_000
LIMITS = Limits(lease_timeout_ms=300_000, attempts=3, exceptions=2)


class CountingConnection(redis.Connection):
    """A redis-py connection that counts the requests it sends: one per round trip."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


@contextmanager
def redis_url() -> Iterator[str]:
    """``BEETLE_REDIS_URL``, or a redis-server of our own for the run."""
    url = os.environ.get("BEETLE_REDIS_URL")
    if url:
        yield url
        return
    from celery_beetle.testing.redis_server import RedisServer  # the test harness starts servers

    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.remove()


def measure_round_trips(store: RedisStore, pairs: int) -> tuple[float, float, float, float]:
    """Per redundant pair and per extra duplicate: (counter, wire) round trips each."""
    owner = f"celery@{socket.gethostname()}:{os.getpid()}"
    pair_counter = pair_wire = dup_counter = dup_wire = 0
    for n in range(pairs + 1):
        facts = MessageFacts("celery", str(uuid.uuid4()), store.clock() + DAY_MS)
        counter, wire = store.round_trips, CountingConnection.sent
        assert store.gate(facts).outcome is Gate.RUN
        token = store.claim(facts, LIMITS, owner).token
        assert store.complete(facts, token).ok
        assert store.gate(facts).outcome is Gate.DROP_DUPLICATE
        pair_counter += store.round_trips - counter
        pair_wire += CountingConnection.sent - wire
        counter, wire = store.round_trips, CountingConnection.sent
        assert store.gate(facts).outcome is Gate.DROP_DUPLICATE  # a third copy, redelivered
        if n == 0:
            # Warm-up, not counted: the connection handshake and the first EVALSHA of each
            # script (NOSCRIPT, then SCRIPT LOAD) happen once per connection.
            pair_counter = pair_wire = 0
            continue
        dup_counter += store.round_trips - counter
        dup_wire += CountingConnection.sent - wire
    return pair_counter / pairs, pair_wire / pairs, dup_counter / pairs, dup_wire / pairs


def measure_memory(store: RedisStore, messages: int) -> tuple[float, float, float]:
    """Average MEMORY USAGE of running and of completed records, and used_memory growth."""
    client = store.client
    owner = f"celery@{socket.gethostname()}:{os.getpid()}"
    facts = [
        MessageFacts("celery", str(uuid.uuid4()), store.clock() + DAY_MS) for _ in range(messages)
    ]
    before = client.info("memory")["used_memory"]
    tokens = [store.claim(f, LIMITS, owner).token for f in facts]
    grown = client.info("memory")["used_memory"] - before
    running = _average_usage(store, facts)
    for f, token in zip(facts, tokens, strict=True):
        store.complete(f, token)
    completed = _average_usage(store, facts)
    return running, completed, grown / messages


def _average_usage(store: RedisStore, facts: list[MessageFacts]) -> float:
    pipe = store.client.pipeline(transaction=False)
    for f in facts:
        pipe.memory_usage(store.key(f.scope, f.message_id), samples=0)
    sizes = pipe.execute()
    return sum(sizes) / len(sizes)


def measure_latency(store: RedisStore, pairs: int) -> float:
    """Microseconds of store time for one redundant pair (4 round trips on localhost)."""
    owner = "celery@bench:1"
    start = time.perf_counter()
    for _ in range(pairs):
        facts = MessageFacts("celery", str(uuid.uuid4()), store.clock() + DAY_MS)
        store.gate(facts)
        store.complete(facts, store.claim(facts, LIMITS, owner).token)
        store.gate(facts)
    return (time.perf_counter() - start) / pairs * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000, help="records for memory")
    parser.add_argument("--pairs", type=int, default=1_000, help="redundant pairs to count")
    args = parser.parse_args(argv)

    with redis_url() as url:
        store = RedisStore.from_url(url, key_prefix=PREFIX, connection_class=CountingConnection)
        try:
            pair, pair_wire, dup, dup_wire = measure_round_trips(store, args.pairs)
            running, completed, grown = measure_memory(store, args.messages)
            latency = measure_latency(store, args.pairs)
            version = store.client.info("server")["redis_version"]
        finally:
            for key in store.client.scan_iter(f"{PREFIX}*", count=1000):
                store.client.delete(key)
            store.close()

    rows = [
        ("round trips per redundant pair", pair, pair_wire, 4, "8-9"),
        ("round trips per dropped duplicate", dup, dup_wire, 1, "4-5"),
    ]
    print(f"dedup store benchmark (Redis {version}; {args.pairs} pairs, {args.messages} records)")
    print(f"{'':38}{'counter':>9}{'wire':>7}{'target':>8}{'beetle':>8}   verdict")
    ok = True
    for name, counted, wire, target, beetle in rows:
        good = max(counted, wire) <= target
        ok &= good
        verdict = "ok" if good else "OVER"
        ratio = f"({max(counted, wire) / target:.2f} of target)"
        print(f"{name:38}{counted:>9.2f}{wire:>7.2f}{target:>8}{beetle:>8}   {verdict} {ratio}")
    good = running <= 300
    ok &= good
    print(
        f"{'bytes per in-flight message':38}{running:>16.1f}{300:>8}{'':>8}   "
        f"{'ok' if good else 'OVER'} ({running / 300:.2f} of target; MEMORY USAGE)"
    )
    print(f"{'bytes per completed message':38}{completed:>16.1f}")
    print(f"{'used_memory growth per message':38}{grown:>16.1f}   (includes the expiry entry)")
    print(f"{'store time per redundant pair':38}{latency:>14.0f}us   (localhost)")
    print("beetle figures are from design.md (the Ruby gem is not run here)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
