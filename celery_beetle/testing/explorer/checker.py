"""The verdict on one run: the audit over the trace, plus the ledger, against :mod:`.allowed`.

Two witnesses that do not share code with the gate: the trace (what the workers decided,
judged by :mod:`celery_beetle.audit.naive`, the audit's verdicts in one process) and the
ledger (what the bodies did, :mod:`.ledger`), plus what the servers hold at the end (dead
letters per message with their reason, messages left in queues, inbox effect rows). Each
message is judged by the rules of :mod:`.allowed`; every breach is a :class:`Violation`
naming the rule, the message and the evidence.

A dead letter blamed on a fault is allowed only with the ledger's proof: an ``ok`` body may
end dead-lettered for ``attempts_limit`` only if it *started* ``attempts`` times, and a body
that returned may end dead-lettered only if a fault killed its process after it returned
(its completion may not have been stored).

The third version's items are judged message by message with the same rules: each member
of a group as the ``ex.work`` body it names; a ``self.retry`` body as one message per run
(``<task id>``, ``<task id>:retry-1``...: the trace and the ledger know each by that
message id), the next awaited once the one before completed (its Retry was published
before it completed), and judged when it shows up anyway; a committed outbox enqueue and a
message published to two queues of one scope as an ``ok`` body, once; a rolled-back
enqueue must never run at all.

The fourth version's: each link of a chain of three or four as the body it names, once the
link before it completed, never when it did not; a ``self.retry`` without a countdown as one
with; the run of a body that retries past its ``max_retries`` as a ``fatal`` body (Celery
raises ``MaxRetriesExceededError``, not in ``retry_on``: dead-lettered at once); each
header task of a chord as the body it names, and the chord's body as an ``ok`` body (it
checks itself that it got every header task's result) once every header task completed,
unless a fault of the Redis process could fail the chord's count in the result backend;
never when a header task did not complete.

The fifth version's: under a queue bound (``queues_bound``: a TTL or a max-length for a
while) a message may end dead-lettered by RabbitMQ, in ``<queue>.dead`` with the ``x-death``
reason ``expired`` or ``maxlen`` (outcome ``dead:broker:<reason>``), and is then judged
dead-lettered rather than lost (still: no more starts than allowed, no body that returned
unkilled); such a dead letter beside another outcome is a surplus copy's. A message with no
outcome and no dead letter is ``lost`` as ever. RabbitMQ 4's limits change no rule.

The sixth version's (``allowed.SIXTH_VERSION``): after a Sentinel failover without
``wait_replicas`` a message the old master may have written for shortly before the kill
(:func:`allowed.failover_may_rerun`) may start again, up to ``attempts`` more, and complete
twice; with ``wait_replicas`` nothing is excused. A worker with tracing off completes a
message when its body returned (or called ``self.retry``) in one of its processes (the
ledger says so), its dead letters are read from the brokers, and the audit's "lost" and
"unexpected", which come from what the trace could not see, are not asked of its
messages. A broker replaced by an empty node is a broker fault, and may take a message with
one copy with it; with ``acks_late=False`` (the owner's choice) also a BeetleTask a worker
took one copy of and whose twin the replaced node held, once its run was cut short
(:func:`allowed.early_ack_twin_lost`, the documented limit "early_ack_twin").
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery_beetle.audit import naive
from celery_beetle.testing.explorer import allowed
from celery_beetle.testing.explorer.ledger import Entry, Ledger
from celery_beetle.testing.explorer.scenario import Item, Scenario

__all__ = [
    "BEETLE_KINDS",
    "Evidence",
    "Trace",
    "Violation",
    "audit_key",
    "awaited",
    "by_broker",
    "chain_modes",
    "chord_body_key",
    "chords_may_fail",
    "early_ack_losses",
    "failover_reruns",
    "judge",
    "known",
    "link_key",
    "member_key",
    "read_trace",
    "retry_key",
    "second_key",
]

WORKER_KILLS = ("worker_kill", "pool_kill")
#: items whose messages are BeetleTasks (awaited by the drain, judged by :func:`_judge_beetle`)
BEETLE_KINDS = ("work", "inbox", "chain", "retry", "group", "outbox", "scoped", "chord")
#: faults of the Redis process, which also holds the result backend of a run with chords
BACKEND_FAULTS = ("redis_kill", "redis_refuse")
DONE = naive.DONE_STATUS
BROKER_FAULTS = ("broker_kill", "broker_freeze", "broker_replace")
#: faults that may take a message with one copy with the broker that held it
ONE_COPY_FAULTS = ("broker_destroy", "broker_replace")
#: a candidate rule, judged over the whole run (:func:`_tolerate_start_window`)
START_WINDOW = "dead_start_window"
#: faults that end a client's connection to a broker while the broker lives on: to the
#: client the broker died (its acks on that connection are dropped, the broker redelivers)
BROKER_LINK_FAULTS = ("partition", "stall", "held_replies")


@dataclass(frozen=True)
class Violation:
    rule: str
    key: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.key}: {self.detail}"


@dataclass
class Trace:
    """Per task id: outcome events from the trace (``completed``, ``dead_lettered`` with
    their reasons, ``started``) and the number of replays."""

    completed: Counter[str] = field(default_factory=Counter)
    started: Counter[str] = field(default_factory=Counter)
    #: per task id, its ``started`` events: (when written, unix seconds; the pool process).
    #: Written once the claim or start that set the lease was stored, so the lease of that
    #: run began at or before it (the body's first ledger line comes later)
    started_at: dict[str, list[tuple[float, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    dead: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: when the first ``dead_lettered`` event of a task id was written (unix seconds)
    first_dead_s: dict[str, float] = field(default_factory=dict)
    replays: Counter[str] = field(default_factory=Counter)
    seen_completed: set[str] = field(default_factory=set)
    #: per key, when its first confirmed ``published`` event was written (ms)
    first_published_ms: dict[str, int] = field(default_factory=dict)
    #: (sixth version) messages a worker with tracing off completed, by the ledger: a body
    #: that returned (or called ``self.retry``) in one of its processes
    ledger_completed: set[str] = field(default_factory=set)
    #: per key (message ids mapped by :meth:`key_of` once read), its confirmed copies: (when
    #: the confirm was written, unix seconds; the broker, as the clients name it)
    copies: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    #: per key, the brokers a worker took a copy of it from (``delivered``)
    delivered_from: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    #: message id -> the checker's key, from the trace events that name both
    keys: dict[str, str] = field(default_factory=dict)

    def key_of(self, message_id: str) -> str:
        """The key that judges the message with id ``message_id`` (the audit names messages
        so). A message is a publish, with an id of its own (:mod:`celery_beetle.message_ids`),
        while the ledger, the brokers' dead letters and the items know a message by its task
        id (a ``self.retry``'s by its ``<task id>:retry-N``): the trace's events carry both,
        so this is the task id of the publish the audit judged, or ``message_id`` itself
        when no event named a task id (a message only an untraced worker published)."""
        return self.keys.get(message_id, message_id)

    def is_completed(self, task_id: str) -> bool:
        return (
            bool(self.completed[task_id])
            or task_id in self.seen_completed
            or task_id in self.ledger_completed
        )


def untraced_completions(ledger: Ledger) -> set[str]:
    """The messages whose body returned, or called ``self.retry``, in a process of a worker
    with tracing off: completed, as far as the effect ledger can tell (a kill before the
    completion was stored is judged as ever, by the ledger's starts)."""
    pids = ledger.untraced_pids
    return {
        key
        for key, entry in ledger.items()
        if any(pid in pids for _ts, pid in [*entry.ends, *entry.retried])
    }


def read_trace(trace_dir: Path, ledger_dir: Path | None = None) -> Trace:
    """The trace's outcomes; with ``ledger_dir`` (a fleet with tracing off in part) also
    what the ledger says the untraced workers completed."""
    trace = Trace()
    if ledger_dir is not None:
        from celery_beetle.testing.explorer.ledger import read_dir

        trace.ledger_completed = untraced_completions(read_dir(ledger_dir))
    by_message: dict[str, str] = {}
    replays: list[str] = []
    for path in naive.expand([trace_dir]):
        for line in Path(path).read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            event, task_id = rec.get("event"), rec.get("task_id")
            if event == "replayed":
                replays.append(str(rec.get("message_id")))
                continue
            if event == "published" and (rec.get("detail") or {}).get("confirmed") is True:
                when_ms, mid = int(rec.get("ts_ms") or 0), str(rec.get("message_id"))
                trace.first_published_ms[mid] = min(
                    when_ms, trace.first_published_ms.get(mid, when_ms)
                )
                trace.copies[mid].append((when_ms / 1000, str(rec.get("broker"))))
            if event == "delivered" and rec.get("broker"):
                trace.delivered_from[str(rec.get("message_id"))].add(str(rec.get("broker")))
            if not task_id:
                continue
            message_id = str(rec.get("message_id"))
            if ":retry-" in message_id:  # a ``self.retry``: a message of its own, same task id
                task_id = message_id
            by_message[message_id] = task_id
            if event == "completed":
                trace.completed[task_id] += 1
            elif event == "started":
                trace.started[task_id] += 1
                when, pid = int(rec.get("ts_ms") or 0) / 1000, rec.get("pid")
                trace.started_at[task_id].append((when, pid if isinstance(pid, int) else -1))
            elif event == "duplicate" and (rec.get("detail") or {}).get("status") in DONE:
                # the store said "completed" to a copy: completed, whether or not the run's
                # own ``completed`` event reached the trace (the audit's completed_unobserved)
                trace.seen_completed.add(task_id)
            elif event == "dead_lettered":
                trace.dead[task_id].append(str((rec.get("detail") or {}).get("reason")))
                when = int(rec.get("ts_ms") or 0) / 1000
                trace.first_dead_s[task_id] = min(when, trace.first_dead_s.get(task_id, when))
    trace.keys = by_message
    _key_by_task(trace)
    for message_id in replays:
        # a message only an untraced worker ran is known by its message id alone
        trace.replays[trace.key_of(message_id)] += 1
    return trace


def _key_by_task(trace: Trace) -> None:
    """Key what the trace gathered per message id (its confirmed copies, the brokers it was
    taken from, its first confirm) by the checker's key, as the ledger and the items are."""
    copies: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for message_id, found in trace.copies.items():
        copies[trace.key_of(message_id)].extend(found)
    delivered_from: dict[str, set[str]] = defaultdict(set)
    for message_id, brokers in trace.delivered_from.items():
        delivered_from[trace.key_of(message_id)].update(brokers)
    first: dict[str, int] = {}
    for message_id, when_ms in trace.first_published_ms.items():
        key = trace.key_of(message_id)
        first[key] = min(when_ms, first.get(key, when_ms))
    trace.copies, trace.delivered_from, trace.first_published_ms = copies, delivered_from, first


@dataclass
class Evidence:
    """What a run left, gathered by the runner after the drain."""

    confirmed: set[str]  # keys whose publish was confirmed
    keys: dict[str, Item]  # key -> the item it was published for
    trace: Trace
    ledger: Ledger
    audit: naive.Verdict
    #: key -> reasons of the dead letters found in ``<queue>.dead`` on the brokers
    dead_letters: dict[str, set[str]] = field(default_factory=dict)
    #: (when, pids) of every process a fault killed with SIGKILL
    kills: list[tuple[float, set[int]]] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    effects: Counter[str] = field(default_factory=Counter)  # inbox effect rows per key
    #: queue -> keys of the messages still there after the workers stopped
    leftover: dict[str, list[str]] = field(default_factory=dict)
    unresolved: set[str] = field(default_factory=set)  # keys without an outcome at the end
    #: (from, to) times Redis could not store anything (killed, refusing writes, cut off)
    redis_outages: list[tuple[float, float]] = field(default_factory=list)
    #: outbox enqueues whose transaction rolled back (never to run)
    rolled_back: set[str] = field(default_factory=set)
    #: indexes of the brokers destroyed for good during the run
    destroyed: set[int] = field(default_factory=set)
    #: (sixth version) indexes of the brokers replaced by an empty node during the run
    replaced: set[int] = field(default_factory=set)
    #: (sixth version) per Sentinel failover: (when the master was killed, the replica's
    #: lag before it, whether writes waited for a replica)
    failovers: list[tuple[float, float, bool]] = field(default_factory=list)
    #: (sixth version) per broker replaced by an empty node, the run's queues it lacks
    missing_queues: dict[str, list[str]] = field(default_factory=dict)
    #: per ``broker_replace`` and ``broker_destroy``: when the node was killed (unix
    #: seconds), and the broker as the clients (and the trace) name it
    replacements: list[tuple[float, str]] = field(default_factory=list)


def second_key(key: str) -> str:
    """The task id of a chain's second task (the first's is the item's key)."""
    return f"{key}c"


def chord_body_key(key: str) -> str:
    """The task id of a chord's body (its header tasks': :func:`member_key`)."""
    return f"{key}b"


def chords_may_fail(faults: Counter[str]) -> bool:
    """A fault of the Redis process may fail a chord's count in the result backend: Celery
    then errors the chord, and its body never runs (FOURTH_VERSION "chord")."""
    return any(faults[k] for k in BACKEND_FAULTS)


def link_key(key: str, n: int) -> str:
    """The task id of a chain's ``n``-th link (0: the item's key; 1: :func:`second_key`)."""
    return key if n == 0 else second_key(key) if n == 1 else f"{key}c{n}"


def chain_modes(item: Item) -> tuple[str, ...]:
    """The body of each link of a chain: the first's ``mode``, then each member's (a chain
    of the second version has no members: a second ``ok`` link)."""
    return (item.mode, *(item.members or ("ok",)))


def member_key(key: str, n: int) -> str:
    """The task id of a group's ``n``-th member."""
    return f"{key}g{n}"


def retry_key(key: str, n: int) -> str:
    """The message id of a ``self.retry`` body's ``n``-th retry (``n`` = 0: the first run)."""
    from celery_beetle.task import message_id_for

    return message_id_for(key, n)


def awaited(
    beetle: set[str], keys: dict[str, Item], trace: Trace, *, chords_may_fail: bool = False
) -> set[str]:
    """The messages whose outcome the drain waits for: the confirmed BeetleTasks (a group's
    or a chord's members rather than the group or chord), the next link of every chain whose
    link before it completed, the next run of a ``self.retry`` body whose run before
    completed, and a chord's body once its header completed (unless ``chords_may_fail``)."""
    out = {k for k in beetle if keys[k].kind not in ("group", "chord")}
    for k in beetle:
        item = keys[k]
        if item.kind == "chain":
            for n in range(1, len(chain_modes(item))):
                if not trace.is_completed(link_key(k, n - 1)):
                    break
                out.add(link_key(k, n))
        elif item.kind == "group":
            out |= {member_key(k, n) for n in range(len(item.members))}
        elif item.kind == "chord":
            header = {member_key(k, n) for n in range(len(item.members))}
            out |= header
            if not chords_may_fail and all(trace.is_completed(m) for m in header):
                out.add(chord_body_key(k))
        elif item.kind == "retry":
            for n in range(item.retries):
                if not trace.is_completed(retry_key(k, n)):
                    break
                out.add(retry_key(k, n + 1))
    return out


def _killed_after(entry_ts: float, pid: int, kills: list[tuple[float, set[int]]]) -> bool:
    return any(ts >= entry_ts and pid in pids for ts, pids in kills)


def _waited_out_its_lease(
    end_ts: float,
    pid: int,
    entry: Entry,
    lease_s: float,
    outages: list[tuple[float, float]],
    stored_starts: Sequence[tuple[float, int]] = (),
) -> bool:
    """A body that returned while Redis could not store its completion, in an outage (faults
    back to back are one: :func:`_joined`) that outlasted its lease, or ended less than
    :data:`allowed.OUTAGE_SLACK_S` before it: the completion may lose its message to another
    run, as the docs say ("keep the lease longer than a failover by a second or more"; the
    explorer's seeds 5012, 97014 and 112010).

    The lease counts from the stored start: the run's traced ``started`` event in that
    process (``stored_starts``), written once the start was stored, else its body's first
    ledger line, which may come a second later on a loaded machine (seed 97014: 0.84 s)."""
    began = max((ts for ts, p in stored_starts if p == pid and ts <= end_ts), default=None)
    if began is None:
        began = max((ts for ts, p in entry.starts if p == pid and ts <= end_ts), default=end_ts)
    slack = allowed.OUTAGE_SLACK_S
    return any(s - 1.0 <= end_ts <= e and e + slack > began + lease_s for s, e in _joined(outages))


def _joined(outages: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The ``outages`` as a waiting completion sees them: one that began less than
    :data:`allowed.OUTAGE_GAP_S` after another ended continues it (a partition followed at
    once by refused writes is one wait, as long as both together)."""
    joined: list[tuple[float, float]] = []
    for began, ended in sorted(outages):
        if joined and began < joined[-1][1] + allowed.OUTAGE_GAP_S:
            joined[-1] = (joined[-1][0], max(joined[-1][1], ended))
        else:
            joined.append((began, ended))
    return joined


def _returned(entry: Entry, ev: Evidence, lease_s: float, key: str) -> list[tuple[float, int]]:
    """The bodies that returned and whose completion nothing excused from being stored: not
    killed after, not waiting out their lease in an outage, not possibly lost in a failover
    without ``wait_replicas`` (allowed.SIXTH_VERSION "redis_failover")."""
    stored_starts = ev.trace.started_at.get(key, [])
    return [
        (ts, pid)
        for ts, pid in entry.ends
        if not _killed_after(ts, pid, ev.kills)
        and not _waited_out_its_lease(ts, pid, entry, lease_s, ev.redis_outages, stored_starts)
        and not allowed.failover_may_lose_completion(ts, ev.failovers)
    ]


def _committed_unmarked(key: str, entry: Entry, ev: Evidence, lease_s: float) -> bool:
    """allowed.SIXTH_VERSION "inbox_unmarked": every run that committed the inbox effect
    did so while Redis could take no write (so its inbox mark, written just before the
    commit, may not have been stored) and was then cut short: killed after, or its
    completion waited out its lease in that outage. Such a run earns no extra start, so at
    ``attempts=1`` the next copy dead-letters the message as any run cut short."""
    if not entry.committed:
        return False
    stored_starts = ev.trace.started_at.get(key, [])
    for committed_ts, pid in entry.committed:
        if not any(s - 1.0 <= committed_ts <= e for s, e in ev.redis_outages):
            return False
        ends = [ts for ts, p in entry.ends if p == pid and ts >= committed_ts]
        if not ends or _killed_after(committed_ts, pid, ev.kills):
            continue  # cut short before it returned, or killed after it
        if not _waited_out_its_lease(
            min(ends), pid, entry, lease_s, ev.redis_outages, stored_starts
        ):
            return False
    return True


def _outcomes(key: str, ev: Evidence) -> set[str]:
    out = {f"dead:{r}" for r in ev.trace.dead.get(key, [])} | {
        f"dead:{r}" for r in ev.dead_letters.get(key, set())
    }
    if ev.trace.is_completed(key):
        out.add("completed")
    return out


def by_broker(reasons: set[str] | list[str]) -> bool:
    """Whether dead letters' ``reasons`` hold one RabbitMQ wrote under a queue bound."""
    return any(f"dead:{r}" in allowed.BOUNDED for r in reasons)


def _judge_beetle(scenario: Scenario, key: str, item: Item, ev: Evidence) -> list[Violation]:
    settings = scenario.settings
    entry: Entry = ev.ledger.entry(key)
    starts = len(entry.starts)
    replays = ev.trace.replays[key]
    if item.kind == "bad" and item.mode == "no_message_id" and ev.faults["replay"]:
        # its dead letter got an id of its own (the trace knows it by that one, not by the
        # task id): a `dead replay --all` during the run may have replayed it
        replays = max(replays, 1)
    outcomes = _outcomes(key, ev)
    found: list[Violation] = []

    def breach(rule: str, detail: str) -> None:
        found.append(Violation(rule, key, f"{detail} ({item.kind}:{item.mode})"))

    if not outcomes:
        if not _early_ack_twin(key, scenario, ev):
            detail = f"no outcome; {starts} start(s), still unresolved={key in ev.unresolved}"
            breach("lost", detail)
        return found
    # the old master's unreplicated writes lost with it (SIXTH_VERSION "redis_failover")
    rerun = _failover_may_rerun(key, ev, settings.timeout_s)
    bounded = outcomes & allowed.BOUNDED if ev.faults["queues_bound"] else set()
    if bounded and outcomes - bounded:
        outcomes -= bounded  # a surplus copy expired or overflowed beside the outcome
    elif bounded:
        return _judge_bounded(scenario, key, item, ev, sorted(bounded))
    most = allowed.max_starts(settings, replays, inbox=item.kind == "inbox") * (2 if rerun else 1)
    if starts > most:
        breach("starts", f"{starts} body starts with attempts={settings.attempts}")
    returned = _returned(entry, ev, settings.timeout_s, key)
    again = any(ts > returned[0][0] for ts, _ in entry.starts) if returned else False
    if again and not replays and not rerun:
        breach("ran_again", f"started again after a body returned at {returned[0][0]:.2f}")
    if "completed" in outcomes and len(outcomes) > 1 and not replays and not rerun:
        breach("both", f"completed and dead-lettered: {sorted(outcomes)}")
    first = min(entry.starts, default=None)
    killed_first = first is not None and _killed_after(first[0], first[1], ev.kills)
    expectation = allowed.expect(item, settings, replays, killed_first)
    for outcome in sorted(outcomes - expectation.outcomes):
        if outcome == "completed":
            # a flaky body succeeds when it runs again, which a failover may cause
            if not (rerun and starts > 1 and item.mode == "flaky"):
                breach("outcome", f"completed, but the body cannot succeed; {starts} start(s)")
            continue
        if outcome != "dead:attempts_limit" or not expectation.interrupted_may_die:
            breach("outcome", f"{outcome}, expected one of {sorted(expectation.outcomes)}")
            continue
        # attempts used up by faults: only with proof that the bodies began, before the
        # (first) dead letter; a replay afterwards may run the message again
        dead_at = ev.trace.first_dead_s.get(key, float("inf"))
        began = [ts for ts, _pid in entry.starts if ts <= dead_at]
        if len(began) < settings.attempts:
            breach(
                # one start short: maybe the start window (:func:`_tolerate_start_window`)
                START_WINDOW if len(began) == settings.attempts - 1 else "dead_never_started",
                f"dead-lettered attempts_limit with attempts={settings.attempts} but the body "
                f"started {len(began)} time(s) before it ({starts} in all, {replays} replay(s))",
            )
        returned = [
            (ts, pid) for ts, pid in _returned(entry, ev, settings.timeout_s, key) if ts <= dead_at
        ]
        if returned:
            breach(
                "success_dead",
                f"dead-lettered attempts_limit although a body returned at {returned[0][0]:.2f} "
                f"in pid {returned[0][1]} and no fault killed it after "
                f"(acks_late={settings.acks_late})",
            )
    if item.kind == "inbox":
        if ev.effects[key] > 1:
            breach("inbox_twice", f"{ev.effects[key]} effect rows behind the inbox")
        if (
            ev.effects[key]
            and any(o.startswith("dead:") for o in outcomes)
            and not _committed_unmarked(key, entry, ev, settings.timeout_s)
        ):
            breach("inbox_committed_dead", f"effect committed, but dead-lettered: {outcomes}")
    return found


def _early_ack_twin(key: str, scenario: Scenario, ev: Evidence) -> bool:
    """allowed.SIXTH_VERSION "early_ack_twin": a message with no outcome and no copy left in
    a queue, whose owner chose ``acks_late=False``, a worker took one copy of, and whose
    other copy (its twin) a ``broker_replace`` or ``broker_destroy`` took. Judged per copy,
    from the trace's ``published`` and ``delivered`` events and the lost broker's address."""
    if _outcomes(key, ev) or any(key in keys for keys in ev.leftover.values()):
        return False
    return allowed.early_ack_twin_lost(
        scenario.settings.acks_late,
        ev.trace.copies.get(key, []),
        ev.trace.delivered_from.get(key, set()),
        ev.replacements,
    )


def early_ack_losses(scenario: Scenario, ev: Evidence) -> list[str]:
    """The confirmed messages lost that :func:`_early_ack_twin` excused (for the run's notes
    and verdict: what early acks cost beside an empty broker)."""
    if scenario.settings.acks_late is not False:
        return []
    keys = set(ev.confirmed) | {i.rsplit("/", 1)[-1] for i in ev.audit.ids.get("lost", [])}
    return sorted(k for k in keys if _early_ack_twin(k, scenario, ev))


def _failover_may_rerun(key: str, ev: Evidence, lease_s: float) -> bool:
    entry = ev.ledger.entry(key)
    starts, ends = [ts for ts, _ in entry.starts], [ts for ts, _ in entry.ends]
    return allowed.failover_may_rerun(starts, ends, ev.failovers, lease_s)


def failover_reruns(scenario: Scenario, ev: Evidence) -> list[str]:
    """The messages that started again after a body returned and that a failover without
    ``wait_replicas`` excused (for the run's notes: what the failover cost)."""
    found = []
    for key, entry in sorted(ev.ledger.items()):
        ends = sorted(ts for ts, _ in entry.ends)
        again = bool(ends) and any(ts > ends[0] for ts, _ in entry.starts)
        if again and _failover_may_rerun(key, ev, scenario.settings.timeout_s):
            found.append(key)
    return found


def _excused_by_the_audits_blind_spot(
    verdict: str, ident: str, scenario: Scenario, ev: Evidence
) -> bool:
    """Whether the audit's verdict on ``<queue>/<message id>`` comes from what the trace
    cannot see, and the message is judged by the ledger and the brokers instead: a message
    RabbitMQ dead-lettered under a queue bound ("lost": no end in the trace); with tracing
    off in part of the fleet, one an untraced worker ran or dead-lettered ("lost") or
    published (a chain's link, a retry: "unexpected", its publish untraced); a message a
    failover without ``wait_replicas`` may have run twice ("duplicated")."""
    key = audit_key(ident, ev)
    if verdict == "lost" and _dead_by_broker(ident, ev):
        return True
    if verdict == "lost" and _early_ack_twin(key, scenario, ev):
        return True  # allowed.SIXTH_VERSION "early_ack_twin"
    if scenario.settings.untraced:
        entry = ev.ledger.entry(key)
        pids = ev.ledger.untraced_pids
        untraced = any(pid in pids for _ts, pid in entry.starts) or bool(ev.dead_letters.get(key))
        if verdict == "lost" and untraced:
            return True
        if verdict == "unexpected" and key not in ev.confirmed:
            return True
    return verdict == "duplicated" and _failover_may_rerun(key, ev, scenario.settings.timeout_s)


def audit_key(ident: str, ev: Evidence) -> str:
    """The checker's key of the audit's ``<queue>/<message id>`` (:meth:`Trace.key_of`)."""
    return ev.trace.key_of(ident.rsplit("/", 1)[-1])


def _dead_by_broker(ident: str, ev: Evidence) -> bool:
    """Whether the audit's ``<queue>/<message id>`` is a message RabbitMQ dead-lettered under
    a queue bound (the audit reads the trace only, where such a message has no end)."""
    key = audit_key(ident, ev)
    return bool(ev.faults["queues_bound"]) and by_broker(ev.dead_letters.get(key, set()))


def _judge_bounded(
    scenario: Scenario, key: str, item: Item, ev: Evidence, reasons: list[str]
) -> list[Violation]:
    """A message RabbitMQ dead-lettered under a queue bound, with no other outcome
    (FIFTH_VERSION "queues_bound"): allowed, but it may not have started more often than
    any message, nor had a body that returned in a process nobody killed (its completion
    would have been stored)."""
    settings, entry = scenario.settings, ev.ledger.entry(key)
    found: list[Violation] = []
    what = f"dead-lettered by the broker ({', '.join(reasons)}) ({item.kind}:{item.mode})"
    replays = ev.trace.replays[key]
    if len(entry.starts) > allowed.max_starts(settings, replays, inbox=item.kind == "inbox"):
        found.append(Violation("starts", key, f"{len(entry.starts)} body starts; {what}"))
    returned = _returned(entry, ev, settings.timeout_s, key)
    if returned and not replays:
        detail = f"a body returned at {returned[0][0]:.2f}, unkilled, never completed; {what}"
        found.append(Violation("success_dead", key, detail))
    if item.kind == "inbox" and ev.effects[key]:
        found.append(Violation("inbox_committed_dead", key, f"effect committed; {what}"))
    return found


def _judge_links(scenario: Scenario, key: str, item: Item, ev: Evidence) -> list[Violation]:
    """A chain's links after the first: each judged as the body it names once the link
    before it completed; never run, never published, when that one did not."""
    found: list[Violation] = []
    for n, mode in enumerate(chain_modes(item)[1:], start=1):
        link = link_key(key, n)
        if ev.trace.is_completed(link_key(key, n - 1)):
            found += _judge_beetle(scenario, link, Item(item.index, "work", mode), ev)
        elif ev.ledger.entry(link).starts or _outcomes(link, ev):
            found.append(
                Violation("chain", link, "ran although the link before it did not complete")
            )
    return found


def _judge_group(scenario: Scenario, key: str, item: Item, ev: Evidence) -> list[Violation]:
    """Each member as the ``ex.work`` body it names (Celery's group: every member is
    published, each runs once as any BeetleTask)."""
    found: list[Violation] = []
    for n, mode in enumerate(item.members):
        found += _judge_beetle(scenario, member_key(key, n), Item(item.index, "work", mode), ev)
    return found


def _judge_chord(scenario: Scenario, key: str, item: Item, ev: Evidence) -> list[Violation]:
    """The header as a group; the body, which checks it got every header task's result, as
    an ``ok`` body once every header task completed (a fault of the Redis process may fail
    the chord instead: then it may never run); never run when one did not."""
    found = _judge_group(scenario, key, item, ev)
    body = chord_body_key(key)
    ran = bool(ev.ledger.entry(body).starts or _outcomes(body, ev))
    header = [member_key(key, n) for n in range(len(item.members))]
    if all(ev.trace.is_completed(m) for m in header):
        if ran or not chords_may_fail(ev.faults):
            found += _judge_beetle(scenario, body, Item(item.index, "work", "ok"), ev)
    elif ran and not ev.faults["replay"]:
        found.append(Violation("chord", body, "ran although a header task did not complete"))
    return found


def _judge_retry(scenario: Scenario, key: str, item: Item, ev: Evidence) -> list[Violation]:
    """Each run of a ``self.retry`` body as a message of its own (an ``ok`` body: a run that
    calls ``self.retry`` is completed once the retry is published). A retry whose run before
    it completed must have its outcome; one whose run before did not may still exist (its
    sender published it, then was killed before its completion): judged when it shows up."""
    found: list[Violation] = []
    ok = Item(item.index, "work", "ok")
    # past max_retries the last run's self.retry raises MaxRetriesExceededError
    last = Item(item.index, "work", "fatal" if item.mode == "past_max" else "ok")
    for n in range(item.retries + 1):
        message = retry_key(key, n)
        sent = not n or ev.trace.is_completed(retry_key(key, n - 1))
        if not sent and not (ev.ledger.entry(message).starts or _outcomes(message, ev)):
            continue
        found += _judge_beetle(scenario, message, last if n == item.retries else ok, ev)
        if n < item.retries and ev.trace.is_completed(message) and not _retried(message, ev):
            found.append(Violation("retry", message, "completed without calling self.retry"))
    if ev.ledger.entry(retry_key(key, item.retries)).retried:
        found.append(Violation("retry", key, f"retried more than {item.retries} time(s)"))
    return found


def _retried(message: str, ev: Evidence) -> bool:
    return bool(ev.ledger.entry(message).retried)


def _judge_rolled_back(key: str, ev: Evidence) -> list[Violation]:
    """README "The outbox": rolled back, it never runs (no start, no outcome, no message)."""
    entry = ev.ledger.entry(key)
    seen = _outcomes(key, ev) | ({"started"} if ev.trace.started[key] else set())
    if entry.starts or seen:
        detail = f"{len(entry.starts)} start(s), trace {sorted(seen)}"
        return [Violation("rolled_back_ran", key, f"rolled back, yet it ran: {detail}")]
    return []


def _judge_order(ev: Evidence) -> list[Violation]:
    """outbox.md "Per-key ordering": a key's rows are published in the order of their ids,
    each once the one before it was confirmed (so the first confirmed publish of each comes
    no earlier than the one of the row before it)."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for key in ev.confirmed:
        item = ev.keys[key]
        if item.kind == "outbox" and item.ordering_key:
            by_key[item.ordering_key].append(key)
    found = []
    first = ev.trace.first_published_ms
    for ordering_key, rows in sorted(by_key.items()):
        published = [row for row in sorted(rows) if row in first]
        for before, after in itertools.pairwise(published):
            if first[after] < first[before]:
                early = first[before] - first[after]
                detail = f"key {ordering_key}: published {early} ms before {before}, a row before"
                found.append(Violation("order", after, detail))
    return found


def _judge_plain(scenario: Scenario, key: str, ev: Evidence) -> list[Violation]:
    entry = ev.ledger.entry(key)
    kills = sum(ev.faults[k] for k in (*WORKER_KILLS, "worker_term"))
    broker_faults = sum(ev.faults[k] for k in BROKER_FAULTS)
    if not entry.starts and allowed.one_copy_may_be_lost(
        sum(ev.faults[k] for k in ONE_COPY_FAULTS)
    ):
        return []
    if ev.faults["queues_bound"] and by_broker(ev.dead_letters.get(key, set())):
        return []  # expired or overflowed before a worker took it: dead-lettered, not lost
    link_faults = sum(ev.faults[k] for k in BROKER_LINK_FAULTS)
    if not entry.starts and not allowed.plain_may_be_lost(kills, broker_faults):
        return [Violation("lost", key, "plain task never ran, and no fault could lose it")]
    starts = len(entry.starts)
    if scenario.settings.pool == "solo":
        starts -= len(_cut_short(entry, ev))
    if allowed.plain_may_outwait_the_consumer_timeout(scenario.settings.consumer_timeout_ms):
        return []  # a channel the broker closed gave it back while the worker kept it
    if starts > 1 and not allowed.plain_may_repeat(broker_faults + link_faults):
        return [Violation("plain_twice", key, f"plain task started {len(entry.starts)} times")]
    return []


def _cut_short(entry: Entry, ev: Evidence) -> list[tuple[float, int]]:
    """The starts whose process a SIGKILL ended before the body did (no end after them in
    that process). allowed.RULES["plain_twice"]: Celery hands an early ack to its event loop, which
    the solo pool's body holds, so such a plain task was still unacked and runs again, with
    pyamqp as with beetle (tests/integration/test_early_ack.py, the explorer's seed 872208)."""
    return [
        (ts, pid)
        for ts, pid in entry.starts
        if _killed_after(ts, pid, ev.kills) and not any(p == pid and t >= ts for t, p in entry.ends)
    ]


def judge(scenario: Scenario, ev: Evidence) -> list[Violation]:
    """Every breach of :mod:`.allowed` in the run; empty when the run is correct."""
    found: list[Violation] = []
    counts = ev.audit.counts
    for verdict in ("lost", "duplicated", "unexpected"):
        for ident in ev.audit.ids.get(verdict, []):
            if _excused_by_the_audits_blind_spot(verdict, ident, scenario, ev):
                continue  # judged below, by the ledger and the brokers
            key = audit_key(ident, ev)
            of = f" (task {key})" if key != ident.rsplit("/", 1)[-1] else ""
            found.append(Violation("audit", ident, f"the audit says {verdict}{of}"))
    if counts.get("malformed_lines"):
        found.append(Violation("audit", "-", f"{counts['malformed_lines']} malformed lines"))
    for key in sorted(ev.confirmed):
        item = ev.keys[key]
        if item.kind == "plain":
            found += _judge_plain(scenario, key, ev)
        elif item.kind == "group":
            found += _judge_group(scenario, key, item, ev)
        elif item.kind == "chord":
            found += _judge_chord(scenario, key, item, ev)
        elif item.kind == "retry":
            found += _judge_retry(scenario, key, item, ev)
        elif item.kind == "bad" and _on_a_destroyed_broker(scenario, item, key, ev):
            continue
        else:
            found += _judge_beetle(scenario, key, item, ev)
        if item.kind == "chain":
            found += _judge_links(scenario, key, item, ev)
    for key in sorted(ev.rolled_back):
        found += _judge_rolled_back(key, ev)
    found += _judge_order(ev)
    found = _tolerate_start_window(found, ev)
    for broker, queues in sorted(ev.missing_queues.items()):
        found.append(Violation("redeclared", broker, f"an empty node never got {queues}"))
    for queue, keys in sorted(ev.leftover.items()):
        # a surplus copy of a message that has its outcome is explained: the next worker
        # drops it as a duplicate; anything else is not
        unexplained = [k for k in keys if not _outcomes(k, ev)]
        if unexplained:
            found.append(Violation("leftover", queue, f"left at the end: {unexplained[:10]}"))
    return found


def _on_a_destroyed_broker(scenario: Scenario, item: Item, key: str, ev: Evidence) -> bool:
    """A raw message has one copy, on broker ``index % brokers``: gone with that broker,
    when it was destroyed for good or replaced by an empty node before anyone took it (no
    outcome at all)."""
    node = item.index % scenario.settings.brokers
    gone = node in ev.destroyed | ev.replaced
    return gone and allowed.one_copy_may_be_lost(1) and not _outcomes(key, ev)


def _tolerate_start_window(found: list[Violation], ev: Evidence) -> list[Violation]:
    """An attempt counts once the start is stored, the instant before the body's first line
    (README "Exactly once"; under prefork the gate's claim for a free process, the hand-over
    to that process before it): a process killed in that instant used an attempt
    its body never began, and no witness outside the process can tell that instant from
    the body's first line. So one message one start short may be dead-lettered per process
    killed (a worker or a pool process, SIGKILL); more than that is a claim counted as a
    start (every delivery queued in the pool at the kill)."""
    window = [v for v in found if v.rule == START_WINDOW]
    others = [v for v in found if v.rule != START_WINDOW]
    if len(window) <= sum(ev.faults[k] for k in WORKER_KILLS):
        return others
    return others + [Violation("dead_never_started", v.key, v.detail) for v in window]


def known(key: str, ev: Evidence) -> list[str]:
    """What the checker knows of one message, a line per witness (the first lines of a
    failing message's story in the soak's report)."""
    item = ev.keys.get(key)
    entry = ev.ledger.entry(key)
    trace = ev.trace
    what = f"{item.kind}:{item.mode} (item {item.index})" if item else "a message of an item"
    return [
        f"{key}: {what}, publish confirmed={key in ev.confirmed}",
        f"  trace: {trace.started[key]} started, {trace.completed[key]} completed, "
        f"told completed by the store={key in trace.seen_completed}, "
        f"dead-lettered {list(trace.dead.get(key, []))}, {trace.replays[key]} replay(s)",
        f"  ledger: {len(entry.starts)} start(s), {len(entry.ends)} end(s), "
        f"{entry.fails} fail(s), {len(entry.committed)} commit(s), {len(entry.retried)} retry",
        f"  brokers' dead letters: {sorted(ev.dead_letters.get(key, set()))}; "
        f"without an outcome at the drain's end: {key in ev.unresolved}",
    ]


def finding(violation: Violation, scenario: Scenario) -> str:
    """Which known kind of defect a violation looks like (a hint for the report, not a
    verdict: the rule broken is the verdict); the fault explorer guide lists them."""
    settings = scenario.settings
    kinds = {f.kind for f in scenario.faults}
    rule = violation.rule
    if rule == "dead_never_started":
        return "known: a claim counted as a start"
    if settings.acks_late is False and rule in (
        "success_dead",
        "inbox_committed_dead",
        "ran_again",
        "lost",
        "audit",
    ):
        return "known: acks_late=False turns a success into a failure"
    if rule == "inbox_committed_dead":
        return "known: an inbox task dead-lettered after its commit"
    if rule == "success_dead":
        return f"new: a returned body's completion not stored in time (pool={settings.pool})"
    if rule in ("lost", "audit", "leftover") and "migrate" in kinds:
        return "known: a migration loses held deliveries?"
    return f"new: {rule}"


def summary(violations: list[Violation], scenario: Scenario) -> dict[str, Any]:
    by_rule = Counter(v.rule for v in violations)
    return {
        "rules": dict(by_rule),
        "findings": sorted({finding(v, scenario) for v in violations}),
    }
