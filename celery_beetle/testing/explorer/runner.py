"""Running one scenario on real servers: start, publish, injure, heal, drain, inspect, judge.

The servers (three RabbitMQ nodes, a Redis with ``appendfsync always`` so that a kill -9
loses no acknowledged write, a PostgreSQL for the inbox) start once per batch
(:class:`~.run.Cluster`, ~5 s a node); each scenario (:class:`~.run.Run`) gets a fresh
vhost on every node, an empty Redis and a fresh database, so scenarios share nothing but
the processes. Workers are
``celery worker`` subprocesses of :mod:`.app` (killable by pid), the publisher
(:mod:`.publish`) a thread of this process publishing each item at its time, the nemesis
(:mod:`.faults`) a thread, and with the outbox a ``beetle relay`` subprocess (:mod:`.relay`).

A run ends by itself: after the last publish and the last fault every server is healed and
every worker slot filled; the run then waits (bounded) until every confirmed BeetleTask has
an outcome in the trace, waits one lease more (a late dead letter of a message that looked
completed must be seen), stops the workers warmly and reads what the brokers still hold.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery_beetle.audit import naive
from celery_beetle.testing.explorer import allowed, checker
from celery_beetle.testing.explorer.faults import Nemesis
from celery_beetle.testing.explorer.ledger import read_dir
from celery_beetle.testing.explorer.publish import Publisher
from celery_beetle.testing.explorer.run import Cluster, Run
from celery_beetle.testing.explorer.scenario import RETRY_DELAY_S, Scenario

__all__ = ["Cluster", "Outcome", "Run", "run_scenario"]


@dataclass
class Outcome:
    scenario: Scenario
    violations: list[checker.Violation]
    faults: Counter[str]
    messages: int
    elapsed_s: float
    base: Path
    notes: list[str] = field(default_factory=list)
    #: the first violating message's story: what the checker knows, then its timeline
    story: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.violations)


def _effects(db_url: str | None) -> Counter[str]:
    if not db_url:
        return Counter()
    import sqlalchemy as sa

    from celery_beetle.outbox.db import engine_for

    engine = engine_for(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT key, count(*) FROM explorer_effects GROUP BY key"))
        out = Counter({str(k): int(c) for k, c in rows})
    engine.dispose()
    return out


def _inspect(run: Run) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """Dead letters per key (with reasons), and the keys of what is left in the scenario's
    other queues (taken out: the scenario is over)."""
    dead: dict[str, set[str]] = {}
    left: dict[str, list[str]] = {}
    for n, node in enumerate(run.nodes):
        if n in run.destroyed:
            continue  # gone for good, with what it held
        # a quorum queue's counts are as of its last tick: every queue is drained (basic_get
        # is exact), and an unacked count is believed only once a tick has passed
        for queue, (_ready, unacked) in node.queue_depths(run.vhost).items():
            where = f"{node.host_port}/{queue}"
            for _method, props, _body in node.get_messages(run.vhost, queue):
                headers = props.headers or {}
                key = _key_of(props)
                if queue.endswith(".dead"):
                    dead.setdefault(key, set()).add(dead_reason(headers))
                else:
                    left.setdefault(where, []).append(key)
            if queue.endswith(".dead") or not unacked:
                continue
            unacked = _still_unacked(node, run.vhost, queue)
            if unacked:
                left.setdefault(where, []).append(f"{unacked} unacked")
    return dead, left


#: RabbitMQ counts a quorum queue's messages on its tick (``quorum_tick_interval``, 5 s)
QUORUM_TICK_S = 5.0


def _still_unacked(node: Any, vhost: str, queue: str) -> int:
    """How many deliveries of ``queue`` a live connection still holds.

    ``rabbitmqctl list_queues`` reports a quorum queue's counts as of its last tick. A
    delivery the stopped workers held shows unacked for up to a tick after their connections
    closed, though the broker has it ready again. Looked at again until a tick has passed.
    """
    deadline = time.monotonic() + QUORUM_TICK_S + 1
    unacked = node.queue_depths(vhost).get(queue, (0, 0))[1]
    while unacked and time.monotonic() < deadline:
        time.sleep(0.5)
        unacked = node.queue_depths(vhost).get(queue, (0, 0))[1]
    return int(unacked)


def _missing_queues(run: Run) -> dict[str, list[str]]:
    """Per broker replaced by an empty node, the run's queues it does not hold at the end
    (the workers and publishers declare them again on a broker that comes back)."""
    missing: dict[str, list[str]] = {}
    for n in sorted(run.replaced - run.destroyed):
        node = run.nodes[n]
        held = node.queue_depths(run.vhost)
        gone = [queue for queue in run.queues if queue not in held]
        if gone:
            missing[node.host_port] = gone
    return missing


def dead_reason(headers: dict[str, Any]) -> str:
    """A dead letter's reason: the worker's ``x-beetle-dead-reason``, or ``broker:<reason>``
    from RabbitMQ's latest ``x-death`` (``expired``, ``maxlen``, ``delivery_limit``...)."""
    reason = headers.get("x-beetle-dead-reason")
    if reason is not None:
        return str(reason)
    deaths = headers.get("x-death") or []
    if not deaths or not isinstance(deaths[0], dict):
        return "None"
    broker = deaths[0].get("reason")
    return f"broker:{broker.decode() if isinstance(broker, bytes) else broker}"


def peek_dead_letters(run: Run) -> dict[str, set[str]]:
    """The dead letters per key on the run's brokers, left where they are (for the drain:
    a message RabbitMQ dead-lettered has an outcome the trace never shows)."""
    dead: dict[str, set[str]] = {}
    for n, node in enumerate(run.nodes):
        if n in run.destroyed or not node.is_running or node.is_paused:
            continue
        try:
            depths = node.queue_depths(run.vhost)
            for queue, (ready, _unacked) in depths.items():
                if not queue.endswith(".dead") or not ready:
                    continue
                for _method, props, _body in node.get_messages(run.vhost, queue, ack=False):
                    key = _key_of(props)
                    dead.setdefault(key, set()).add(dead_reason(props.headers or {}))
        except Exception:  # a node mid-restart: the next look sees it
            continue
    return dead


def _key_of(props: Any) -> str:
    headers = props.headers or {}
    if ":retry-" in str(props.message_id):  # a self.retry: its own message
        return str(props.message_id)
    return str(headers.get("id") or props.correlation_id or "?")


def _by_reason(dead: dict[str, set[str]]) -> dict[str, int]:
    """How many messages have a dead letter of each reason (the broker's as ``broker:…``)."""
    return dict(Counter(reason for reasons in dead.values() for reason in reasons))


def drain_deadline_s(scenario: Scenario) -> float:
    """Long enough for every body to run on the scenario's pool slots, plus its leases: a
    single solo worker with many long bodies needs minutes (soak seeds 3021 and 3047 were
    judged "lost" while their worker was still busy)."""
    s = scenario.settings
    countdown = max((i.countdown_s for i in scenario.items), default=0.0)
    slots = max(1, s.workers * s.concurrency)
    return min(
        300.0, countdown + body_seconds(scenario) / slots + s.timeout_s * (s.attempts + 2) + 45
    )


def body_seconds(scenario: Scenario) -> float:
    """How long the bodies of ``scenario`` sleep in all, each start of each (explorer app)."""
    s = scenario.settings
    total = 0.0
    for item in scenario.items:
        if item.kind == "work" and item.mode == "long":
            seconds = s.timeout_s / 2
        elif item.kind == "work" and item.mode == "overrun":
            seconds = s.timeout_s * 1.5
        elif item.kind == "retry":  # each retry a run, after its countdown
            wait = item.retry_s or RETRY_DELAY_S
            seconds = item.sleep_s * (item.retries + 1) + wait * item.retries
        elif item.kind == "group" or item.kind == "chord":
            seconds = item.sleep_s * len(item.members) * s.attempts
        elif item.kind == "chain" and item.members:  # a link after another
            seconds = item.sleep_s * (len(item.members) + 1) * s.attempts
        else:
            seconds = item.sleep_s
        starts = s.attempts if item.kind == "work" and item.mode in ("fail", "flaky") else 1
        total += seconds * starts
    return total


def _story(
    violations: list[checker.Violation], evidence: checker.Evidence, base: Path
) -> list[str]:
    """The first violating message's story (nothing when the run passed)."""
    if not violations:
        return []
    from celery_beetle.testing.explorer.timeline import timeline

    # a message's, rather than a queue's (``leftover``) or the whole trace's (``-``)
    messages = [v for v in violations if v.rule != "leftover" and v.key != "-"]
    if not messages:
        return [str(violations[0])]
    first = messages[0]
    key = checker.audit_key(first.key, evidence)  # the audit names ``<queue>/<message id>``
    return [str(first), *checker.known(key, evidence), *timeline(base, key, 40)]


def run_scenario(cluster: Cluster, scenario: Scenario, base: Path) -> Outcome:
    """Run ``scenario`` on ``cluster``'s servers; every process it started is gone after."""
    t0 = time.monotonic()
    base.mkdir(parents=True, exist_ok=True)
    (base / "scenario.json").write_text(scenario.to_json())
    run = Run(cluster, scenario, base)
    notes: list[str] = []
    nemesis = Nemesis(run)
    try:
        run.fleet.start_all()
        if run.relay is not None:
            run.relay.start()
        run.started = time.monotonic()
        publisher = Publisher(run)
        publisher.start()
        nemesis.start()
        publisher.join(scenario.publish_s + 120)
        nemesis.finish(timeout=max(f.at_s for f in scenario.faults) + 60 if scenario.faults else 1)
        run.heal()
        run.fleet.fill()
        if run.relay is not None:
            run.relay.ensure()
        keys = {run.key(i): i for i in scenario.items}
        beetle = {k for k in publisher.confirmed if keys[k].kind in checker.BEETLE_KINDS}
        deadline = time.monotonic() + drain_deadline_s(scenario)
        # with tracing off in part of the fleet the ledger tells its completions
        ledger_dir = run.ledger if scenario.settings.untraced else None
        trace = checker.read_trace(run.trace, ledger_dir)
        fragile = checker.chords_may_fail(nemesis.counts)
        wanted = checker.awaited(beetle, keys, trace, chords_may_fail=fragile)
        # what RabbitMQ dead-lettered (a queue bound), or a worker with tracing off, has no
        # outcome in the trace
        bounded = bool(nemesis.counts["queues_bound"] or scenario.settings.untraced)
        by_broker = peek_dead_letters(run) if bounded else {}
        looked = time.monotonic()
        while run.resolved(trace, wanted, by_broker) != wanted and time.monotonic() < deadline:
            time.sleep(1)
            trace = checker.read_trace(run.trace, ledger_dir)
            wanted = checker.awaited(beetle, keys, trace, chords_may_fail=fragile)
            if bounded and time.monotonic() - looked > 5:
                by_broker, looked = peek_dead_letters(run), time.monotonic()
        unresolved = wanted - run.resolved(trace, wanted, by_broker)
        time.sleep(scenario.settings.timeout_s + 3)  # a late second outcome shows up
        if run.relay is not None:
            run.relay.stop()
        run.fleet.stop()
        from kombu_beetle.trace import flush_all

        flush_all()
        run.heal()
        dead, left = _inspect(run)
        missing = _missing_queues(run)
        evidence = checker.Evidence(
            confirmed=publisher.confirmed,
            rolled_back=publisher.rolled_back,
            destroyed={n for n in run.destroyed},
            replaced=set(run.replaced),
            replacements=[(ts, run.proxies[n].host_port) for ts, n in nemesis.replacements],
            failovers=nemesis.failovers,
            missing_queues=missing,
            keys=keys,
            trace=checker.read_trace(run.trace, ledger_dir),
            ledger=read_dir(run.ledger),
            audit=naive.judge(naive.expand([run.trace])),
            dead_letters=dead,
            kills=nemesis.kills,
            redis_outages=nemesis.redis_outages,
            faults=nemesis.counts,
            effects=_effects(run.db_url),
            leftover=left,
            unresolved=unresolved,
        )
        violations = checker.judge(scenario, evidence)
        story = _story(violations, evidence, base)
        notes += run.notes + publisher.errors[:5] + nemesis.errors
        reruns = checker.failover_reruns(scenario, evidence)
        if reruns:
            notes.append(f"a failover without wait_replicas ran {len(reruns)} message(s) again")
        twins = checker.early_ack_losses(scenario, evidence)
        if twins:
            notes.append(
                f"acks_late=False: {len(twins)} message(s) lost with their twin (wiped with "
                f"its broker, or never made) (allowed by rule {allowed.EARLY_ACK_TWIN})"
            )
        (base / "verdict.json").write_text(
            json.dumps(
                {
                    "violations": [str(v) for v in violations],
                    **checker.summary(violations, scenario),
                    "nemesis": nemesis.describe(),
                    "publish_errors": publisher.errors,
                    "audit": evidence.audit.counts,
                    "dead_letters_by_reason": _by_reason(dead),
                    "failover_reruns": reruns,
                    "early_ack_twin_losses": twins,
                    "story": story,
                },
                indent=1,
            )
        )
        return Outcome(
            scenario,
            violations,
            nemesis.counts,
            len(publisher.confirmed),
            round(time.monotonic() - t0, 1),
            base,
            notes,
            story,
        )
    finally:
        run.unlimit()
        nemesis.stopping.set()
        for proc in nemesis.helpers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if run.relay is not None:
            run.relay.kill()
        if run.destroyed:
            cluster.heal()  # a new node where the destroyed one was, for the next scenario
        for worker in run.fleet.every:
            worker.kill()
