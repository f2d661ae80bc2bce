"""Synthetic trace generator with a known verdict.

The audit is only trustworthy if it is checked against traces whose answer is known in
advance, at a size where performance matters. This script writes JSON-lines trace files
shaped like the real ones (one file per host process, publisher and worker roles, two brokers
per redundant message, clock skew between hosts) and plants chosen numbers of each bad class,
so ``expected.json`` is the exact verdict an audit must reach.

Usage::

    python -m benchmarks.gen_trace OUT_DIR --events 10000000 [--lost 50 --duplicated 40 ...]

Messages are spread over ``--procs`` generator processes; each one writes its own set of
per-"process" files, so generation scales with cores and the output looks like a fleet.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# ``%`` formatting of a fixed template is several times faster than json.dumps per line,
# which matters at 10 M events. Fields that may be null are passed pre-rendered.
LINE = (
    '{"ts_ms":%d,"event":"%s","message_id":"%s","queue":"%s","task_name":"%s",'
    '"task_id":"%s","broker":%s,"worker":%s,"pid":%s,"attempt":%s,"detail":%s}\n'
)
BROKERS = ('"rabbit-a:5672"', '"rabbit-b:5672"', '"rabbit-c:5672"')
QUEUES = ("orders", "emails", "billing", "reports")
TASKS = {
    "orders": "shop.process_order",
    "emails": "shop.send_email",
    "billing": "shop.charge_card",
    "reports": "shop.render_report",
}
BASE_TS_MS = 1_763_769_600_000
BAD_CLASSES = ("lost", "duplicated", "overlapped", "unexpected", "dead_lettered", "expired")


@dataclass
class Plan:
    """How many messages of each kind to plant; the rest complete once."""

    messages: int
    lost: int = 0
    duplicated: int = 0  # completed twice, sequential runs
    overlapped: int = 0  # two runs overlapping in time, one completion
    unexpected: int = 0
    dead_lettered: int = 0
    expired: int = 0
    retried: int = 0  # failed once, retried, then completed once
    unobserved: int = 0  # completed, event lost to kill -9; the other copy's duplicate tells
    non_redundant_pct: int = 10
    malformed: int = 0
    skew_ms: int = 200
    procs: int = 2
    files_per_proc: int = 6
    seed: int = 7


@dataclass
class Host:
    """One traced process: its file, identity and clock offset."""

    name: str
    pid: int
    role: str
    skew_ms: int
    lines: list[str] = field(default_factory=list)


def _mix(x: int) -> int:
    """splitmix64: a cheap bijection that scatters consecutive counters."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _mid(i: int, seed: int) -> str:
    """A uuid-shaped, unique, well-scattered id from a counter (uuid4 is too slow at 10 M)."""
    s = f"{_mix(i):016x}{_mix(i ^ (seed << 40)):016x}"  # unique: _mix is a bijection
    return f"{s[:8]}-{s[8:12]}-4{s[13:16]}-a{s[17:20]}-{s[20:]}"


def _q(s: str) -> str:
    return f'"{s}"'


class _Writer:
    """Renders the events of one message into the per-host buffers."""

    def __init__(self, pubs: list[Host], workers: list[Host], rng: random.Random) -> None:
        self.pubs, self.workers, self.rng = pubs, workers, rng

    def ev(self, host: Host, t: int, event: str, mid: str, queue: str, **kw: object) -> None:
        host.lines.append(
            LINE
            % (
                t + host.skew_ms,
                event,
                mid,
                queue,
                TASKS[queue],
                mid,
                kw.get("broker", "null"),
                _q(f"celery@{host.name}") if host.role == "worker" else "null",
                host.pid,
                kw.get("attempt", "null"),
                kw.get("detail", "null"),
            )
        )

    def message(self, kind: str, i: int, seed: int, non_redundant: bool) -> None:
        rng = self.rng
        mid = _mid(i, seed)
        queue = QUEUES[i % len(QUEUES)]
        t = BASE_TS_MS + i * 3 + rng.randrange(1000)
        pub = self.pubs[i % len(self.pubs)]
        w1 = self.workers[i % len(self.workers)]
        w2 = self.workers[(i + 1) % len(self.workers)]
        b1, b2 = BROKERS[i % 3], BROKERS[(i + 1) % 3]
        e = self.ev
        run = 200 + rng.randrange(800)
        if kind != "unexpected":
            if non_redundant:
                d = '{"confirmed":true,"redundant":false,"copies":1}'
                e(pub, t, "published", mid, queue, broker=b1, detail=d)
            else:
                d = '{"confirmed":true,"redundant":true,"copies":2}'
                e(pub, t, "published", mid, queue, broker=b1, detail=d)
                e(pub, t + 1, "published", mid, queue, broker=b2, detail=d)
        s = t + 5 + rng.randrange(50)
        if kind == "expired":
            e(w1, s, "delivered", mid, queue, broker=b1)
            e(w1, s + 1, "expired", mid, queue, broker=b1)
            if not non_redundant:
                e(w2, s + 3, "delivered", mid, queue, broker=b2)
                e(w2, s + 4, "expired", mid, queue, broker=b2)
            return
        e(w1, s, "delivered", mid, queue, broker=b1)
        if kind == "unobserved":
            e(w1, s + 1, "started", mid, queue, broker=b1, attempt=1)
            e(w2, s + run + 5, "delivered", mid, queue, broker=b2)
            e(w2, s + run + 6, "duplicate", mid, queue, broker=b2, detail='{"status":"c"}')
            return
        if kind == "lost":
            e(w1, s + 1, "started", mid, queue, broker=b1, attempt=1)
            return  # worker killed, lease never reclaimed within the trace
        if kind in ("retried", "dead_lettered"):
            e(w1, s + 1, "started", mid, queue, broker=b1, attempt=1)
            exc = '{"exc":"ConnectionError(\'db down\')"}'
            e(w1, s + run, "failed", mid, queue, broker=b1, attempt=1, detail=exc)
            e(w1, s + run + 1, "retried", mid, queue, broker=b1, attempt=1, detail='{"delay_s":2}')
            s2 = s + run + 2000
            e(w2, s2, "delivered", mid, queue, broker=b2)
            e(w2, s2 + 1, "started", mid, queue, broker=b2, attempt=2)
            if kind == "dead_lettered":
                e(w2, s2 + run, "failed", mid, queue, broker=b2, attempt=2, detail=exc)
                e(
                    w2,
                    s2 + run + 1,
                    "dead_lettered",
                    mid,
                    queue,
                    broker=b2,
                    attempt=2,
                    detail='{"reason":"attempts exhausted"}',
                )
            else:
                e(w2, s2 + run, "completed", mid, queue, broker=b2, attempt=2)
            return
        if kind == "overlapped":
            e(w1, s + 1, "started", mid, queue, broker=b1, attempt=1)
            e(w2, s + 3, "delivered", mid, queue, broker=b2)
            e(w2, s + 4, "started", mid, queue, broker=b2, attempt=2)
            e(w1, s + 4000, "completed", mid, queue, broker=b1, attempt=1)
            e(
                w2,
                s + 4100,
                "failed",
                mid,
                queue,
                broker=b2,
                attempt=2,
                detail='{"exc":"IntegrityError()"}',
            )
            e(w2, s + 4101, "dead_lettered", mid, queue, broker=b2, attempt=2)
            return
        e(w1, s + 1, "started", mid, queue, broker=b1, attempt=1)
        e(
            w1,
            s + run,
            "completed",
            mid,
            queue,
            broker=b1,
            attempt=1,
            detail=f'{{"runtime_ms":{run}}}',
        )
        if kind == "duplicated":
            s2 = s + run + 3000
            e(w2, s2, "delivered", mid, queue, broker=b2)
            e(w2, s2 + 1, "started", mid, queue, broker=b2, attempt=1)
            e(w2, s2 + run, "completed", mid, queue, broker=b2, attempt=1)
            return
        if non_redundant or kind == "unexpected":
            return
        if i % 10 == 0:  # second copy arrived mid-run: deferred, then dropped once completed
            e(w2, s + 3, "delivered", mid, queue, broker=b2)
            e(w2, s + 4, "deferred", mid, queue, broker=b2, detail='{"delay_s":1}')
            s += run + 1000
        e(w2, s + run + 2, "delivered", mid, queue, broker=b2)
        e(w2, s + run + 3, "duplicate", mid, queue, broker=b2)


MALFORMED = (
    '{"ts_ms":1763769600000,"event":"completed","message_id":"trunc',  # crash mid-write
    '{"ts_ms":"yesterday","event":"started","message_id":"x","queue":"orders"}',  # wrong type
    '{"event":"completed","queue":"orders"}',  # missing ts_ms and message_id
    "not json at all",
)


def _chunk(args: tuple[Plan, str, int, list[str], int]) -> int:
    """Write one generator process's files; returns the number of lines written."""
    plan, out, chunk, kinds, start = args
    rng = random.Random(plan.seed * 1000 + chunk)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(BASE_TS_MS / 1000))
    n_pub = max(1, plan.files_per_proc // 3)

    def host(role: str, k: int) -> Host:
        name = f"{role[:3]}-{chunk:02d}-{k:02d}"
        skew = rng.randint(-plan.skew_ms, plan.skew_ms)
        return Host(name, 10_000 + chunk * 100 + k, role, skew)

    pubs = [host("publisher", k) for k in range(n_pub)]
    workers = [host("worker", k) for k in range(max(2, plan.files_per_proc - n_pub))]
    w = _Writer(pubs, workers, rng)
    lines = 0
    hosts = pubs + workers
    for j, kind in enumerate(kinds):
        i = start + j
        w.message(kind, i, plan.seed, non_redundant=(i % 100) < plan.non_redundant_pct)
        if j % 50_000 == 49_999 or j == len(kinds) - 1:
            for h in hosts:
                path = Path(out) / f"{h.name}-{h.pid}-{h.role}-{stamp}-000.jsonl"
                with open(path, "a") as f:
                    f.writelines(h.lines)
                lines += len(h.lines)
                h.lines.clear()
    return lines


def _kinds(plan: Plan) -> list[str]:
    kinds = ["ok"] * plan.messages
    n = 0
    for k in (*BAD_CLASSES, "retried", "unobserved"):
        c = getattr(plan, k)
        kinds[n : n + c] = [k] * c
        n += c
    if n > plan.messages:
        raise SystemExit(f"planted classes ({n}) exceed --messages ({plan.messages})")
    random.Random(plan.seed).shuffle(kinds)
    return kinds


def expected_verdict(plan: Plan) -> dict[str, int]:
    """The verdict an audit must reach for this plan (see celery_beetle.audit.schema)."""
    bad = plan.lost + plan.duplicated + plan.overlapped + plan.unexpected
    return {
        "messages": plan.messages,
        "completed_once": plan.messages - bad - plan.dead_lettered - plan.expired,
        "lost": plan.lost,
        "duplicated": plan.duplicated + plan.overlapped,
        "unexpected": plan.unexpected,
        "dead_lettered": plan.dead_lettered,
        "expired": plan.expired,
        "malformed_lines": plan.malformed,
        "retried_messages": plan.retried + plan.dead_lettered,
        "completed_unobserved": plan.unobserved,
    }


def generate(plan: Plan, out: str | os.PathLike[str]) -> dict[str, int]:
    """Write the trace under ``out`` and ``out/../<name>.expected.json``; return the verdict."""
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    for old in outp.glob("*.jsonl"):
        old.unlink()
    kinds = _kinds(plan)
    per = -(-plan.messages // plan.procs)
    jobs = [
        (plan, str(outp), c, kinds[c * per : (c + 1) * per], c * per) for c in range(plan.procs)
    ]
    if plan.procs > 1:
        with multiprocessing.get_context("fork").Pool(plan.procs) as pool:
            lines = sum(pool.map(_chunk, jobs))
    else:
        lines = sum(_chunk(j) for j in jobs)
    if plan.malformed:
        rng = random.Random(plan.seed)
        files = sorted(outp.glob("*.jsonl"))
        for k in range(plan.malformed):
            with open(files[k % len(files)], "a") as f:
                f.write(MALFORMED[rng.randrange(len(MALFORMED))] + "\n")
    verdict = expected_verdict(plan)
    verdict["events"] = lines
    (outp.parent / f"{outp.name}.expected.json").write_text(json.dumps(verdict, indent=2))
    return verdict


def plan_for_events(events: int, **kw: int) -> Plan:
    """Size a plan so the trace holds roughly ``events`` valid lines (~6.9 per message)."""
    messages = max(100, int(events / 6.92))
    bad = max(1, messages // 100_000)
    defaults = dict(
        lost=5 * bad,
        duplicated=3 * bad,
        overlapped=2 * bad,
        unexpected=2 * bad,
        dead_lettered=10 * bad,
        expired=4 * bad,
        retried=messages // 50,
        unobserved=3 * bad,
        malformed=7 * bad,
    )
    defaults.update(kw)
    return Plan(messages=messages, **defaults)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--events", type=int, help="size by events instead of --messages")
    p.add_argument("--messages", type=int, default=10_000)
    for k in (*BAD_CLASSES, "retried", "unobserved", "malformed"):
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=None)
    p.add_argument("--skew-ms", type=int, default=200)
    p.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--files-per-proc", type=int, default=6)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args(argv)
    counts = {
        k: getattr(a, k)
        for k in (*BAD_CLASSES, "retried", "unobserved", "malformed")
        if getattr(a, k) is not None
    }
    opts = dict(skew_ms=a.skew_ms, procs=a.procs, files_per_proc=a.files_per_proc, seed=a.seed)
    if a.events:
        plan = plan_for_events(a.events, **counts, **opts)
    else:
        plan = Plan(messages=a.messages, **counts, **opts)
    t0 = time.perf_counter()
    verdict = generate(plan, a.out)
    took = time.perf_counter() - t0
    print(json.dumps(verdict, indent=2))
    print(f"wrote {verdict['events']:,} events in {took:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
