"""What each body and each setting allows: the explorer's one table, written from the README.

The checker (:mod:`.checker`) never decides on its own what is acceptable; it asks this
module. Each rule quotes the README sentence (or the design's "Rules that hold at the
defaults") it comes from, so a disagreement between a run and the table is either a bug in
the product or a defect of the README/table pair, and the quote says which text to re-read.

Outcomes are ``completed`` or ``dead:<reason>`` (the ``x-beetle-dead-reason`` of
:mod:`celery_beetle.worker.deadletter`).
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_beetle.testing.explorer.scenario import Item, Settings

__all__ = [
    "BOUNDED",
    "EARLY_ACK_TWIN",
    "FIFTH_VERSION",
    "FOURTH_VERSION",
    "OUTAGE_SLACK_S",
    "RULES",
    "SIXTH_VERSION",
    "THIRD_VERSION",
    "Expectation",
    "early_ack_twin_lost",
    "expect",
    "failover_may_lose_completion",
    "failover_may_rerun",
    "max_starts",
    "one_copy_may_be_lost",
]

#: rule name -> where it comes from (README section, or design.md), quoted
RULES: dict[str, str] = {
    "lost": 'README "Exactly once": a message leaves its queue only once its outcome or its '
    "dead letter is stored (so a confirmed BeetleTask ends completed or dead-lettered)",
    "audit": 'README "The delivery audit": no message lost, duplicated or unexpected',
    "starts": 'README table: attempts = "how many times a message may start"; design.md: '
    "`attempts` counts body starts",
    "dead_never_started": "design.md: a claim whose body never began never uses an attempt "
    "(so attempts_limit needs `attempts` starts in the ledger); README: an attempt counts "
    "once the start is stored, the instant before the body's first line (under prefork the "
    "gate's claim for a free process, the hand-over before it), so one message per process "
    "killed may be one start short",
    "success_dead": 'README "Exactly once": when the body succeeded the gate stores the '
    "completion (a body that returned, in a process nobody killed, is completed)",
    "ran_again": 'README "the inbox": the dedup store runs a body once unless its worker dies '
    "after the body's effects and before the completion reaches Redis",
    "outcome": "README: retries while `exceptions` allow, then `<queue>.dead` with the "
    "reason; an exception not in retry_on dead-letters at once",
    "both": "README: one outcome per message (a completed message is never dead-lettered, "
    "unless a replay ran it again)",
    "inbox_twice": 'README "the inbox": two runs cannot both commit (one effect per message)',
    "inbox_committed_dead": 'README "the inbox": a run after a committed one finds the row '
    "and returns, and is completed in the dedup store like any successful run",
    "leftover": "nothing left in the queue, its delay queues or unexplained in `.dead` once "
    "every message has its outcome",
    "chain": "Celery's chain: the second task is published once the first succeeded, and "
    "never when it failed (each then runs once, as any BeetleTask); a chord's body likewise "
    'never runs when a header task did not complete (FOURTH_VERSION "chord")',
    "plain_twice": 'README: "a plain task: one broker, exactly as on pyamqp" (acked before '
    "it runs: at most once, unless a broker's ack was lost with it, or, under the solo pool, "
    "its worker was SIGKILLed while the body ran: Celery sends the early ack from its event "
    "loop, which the solo body holds; or it waited in a busy worker past a lowered "
    "`consumer_timeout`, which gave it back while the worker kept its request; see limits.md)",
    # the draw's third version
    "retry": 'celery-features.md: "`self.retry()`: a new message, `<task id>:retry-N`, through '
    "beetle's delay queues\" (so each run of a retrying body is a message of its own, judged "
    "by every rule above; a run that called self.retry completes, and the body retries as "
    "often as it asks, no more)",
    "rolled_back_ran": 'outbox.md "The outbox": "committed: both run once. Rolled back: '
    'neither ever runs" (no start, no outcome)',
    "redeclared": 'transport.md "What happens when a broker fails": a broker that comes back '
    'has "its queues, bindings, QoS and consumers ... set up again" (an empty node in a '
    "broker's place holds the run's queues again by the end: SIXTH_VERSION "
    '"broker_replace")',
    "order": 'outbox.md "Per-key ordering": "tasks of one key are published one after '
    "another, each once the one before it was confirmed by the brokers, in the order of "
    'their ids" (the order they *run* in is not promised, and not judged)',
}

#: what the third version's items and faults allow, each from its doc (no rule of its own:
#: each says which rules above hold unchanged)
THIRD_VERSION: dict[str, str] = {
    "group": 'celery-features.md: "chains, groups, chords ...: as in Celery, each body once" '
    "(each member judged as the body it names)",
    "outbox": 'outbox.md: "committed: both run once"; "A relay killed between publish and '
    "delete leaves the row; the next pass publishes it again and the dedup store drops the "
    "second copy\" (so a relay kill allows nothing more); an ordering key holds a key's rows "
    "back, never loses one",
    "scoped": 'exactly-once.md: "A message is one per `(scope, message_id)`: one record, one '
    'run"; `beetle_dedup_scopes`: "a message in both runs once" (one ok body, once)',
    "broker_destroy": 'transport.md "What happens when a broker fails": a redundant message '
    "has two copies on two brokers, so one broker lost for good (within N-2: three brokers) "
    "loses no BeetleTask; a message with one copy there (a plain task, a raw message) may "
    "go with it",
    "queues_apply": 'operations.md: `beetle queues apply` "writes only what differs" and '
    "RabbitMQ applies a policy to a live queue at once; policies that bound nothing the run "
    "reaches (a day's TTL, a million messages) change no outcome",
    "latency": "transport.md: a broker is marked dead only when it refuses, resets or does "
    "not confirm within `confirm_timeout` (1 s here); added latency below that (at most "
    "200 ms each way) is not a fault to any rule: every rule holds unchanged",
}

#: what the fourth version's items allow, each from its doc (no rule of its own either)
FOURTH_VERSION: dict[str, str] = {
    "long_chain": 'celery-features.md: "chains ...: as in Celery, each body once" (Celery\'s '
    "chain publishes each link once the one before it succeeded, never after a failure: "
    'the rule "chain" holds link by link)',
    "retry_without_countdown": 'celery-features.md: "`self.retry()`: a new message, '
    "`<task id>:retry-N`, through beetle's delay queues\" (without a countdown Celery's "
    '`default_retry_delay` is the delay: the rule "retry" holds unchanged)',
    "chord": 'celery-features.md: "chains, groups, chords ...: as in Celery, each body '
    'once"; "the body runs once with all 20 results. At the defaults (`attempts=1`) the '
    "interrupted header is dead-lettered, a `FAILURE` in the backend: the chord fails once, "
    'its body never runs" (each header task judged as the body it names; the body, which '
    "checks it got every header result, runs once when every header task completed, never "
    "when one did not; a fault of the Redis process that holds the result backend may fail "
    "the chord's count, and then the body may never run)",
    "retry_past_max": "Celery's `self.retry()` past `max_retries` raises "
    "`MaxRetriesExceededError` in the body; README: an exception not in `retry_on` "
    "dead-letters at once (the explorer's `retry_on` is RuntimeError: the last run is a "
    "`fatal` body, `dead:not_retryable`)",
}

#: what the fifth version's settings and faults allow, each from its doc
FIFTH_VERSION: dict[str, str] = {
    "rabbit4": 'compatibility.md "RabbitMQ 3.x and 4.x" and operations.md: a quorum queue\'s '
    "delivery-limit of 20 drops (or dead-letters) a message returned more often; a worker "
    "replaces a delivery counted 10 times by a fresh copy, so hand-backs, restarts and "
    "consumer timeouts never add up to it (every rule holds unchanged: a dead letter with "
    "RabbitMQ's reason `delivery_limit` is an `outcome` breach)",
    "consumer_timeout": "a channel the broker closes under a consumer (a delivery held "
    "unacked past consumer_timeout) gives its deliveries back; the worker consumes again "
    "on a new channel (every rule holds unchanged)",
    "queues_bound": 'operations.md "Queue policies": every broker-side dead letter '
    "(expired, overflowed) lands in the queue's own `<queue>.dead`, with RabbitMQ's "
    "`x-death` reason; so under a TTL or a max-length a message may end dead-lettered by "
    "the broker (`broker:expired`, `broker:maxlen`) instead of running, never silently "
    "gone (no outcome at all is still `lost`); a copy that expired beside one that "
    "completed is a surplus copy, not a second outcome",
}

#: what the sixth version's settings and faults allow, each from its doc
SIXTH_VERSION: dict[str, str] = {
    "redis_failover": 'limits.md "Redis failover": "Redis replicates asynchronously: after '
    "a Sentinel failover the new master may lack the last claims and completions the old one "
    'acknowledged, and those messages run again, unless `beetle_redis_wait_replicas` is set"; '
    '"Without it, a message whose completion was lost but whose start was kept is '
    'dead-lettered `attempts_limit` once its attempts are used up" (so without it a message '
    "whose claim, start or completion the old master may have acknowledged unreplicated may "
    "start again, up to `attempts` more, and complete twice, and a body that returned in the "
    "replica's lag before the kill may leave its message dead-lettered `attempts_limit`; "
    "with it nothing runs twice: every rule holds unchanged)",
    "replica_lag": 'exactly-once.md "When Redis is unavailable or fails over": "With '
    "`beetle_redis_wait_replicas = 1` a write that no replica acknowledged within a second "
    'is treated like an unreachable Redis" (a frozen replica is a Redis outage: every rule '
    "holds, and a completion that waited past its lease is excused as in any outage)",
    "inbox_unmarked": 'limits.md "The inbox costs starts": "A body that marked its inbox '
    'commit and was cut short may start up to 2 more times than `attempts`"; "A body that '
    "committed while Redis took no writes could not mark it: cut short, or its completion "
    "waiting out its lease, it is dead-lettered at `attempts=1` (`attempts_limit`), its "
    'effect committed" (so an inbox effect committed in a Redis outage, by a run then '
    "killed or whose completion waited out its lease in that outage, may end "
    "`dead:attempts_limit`; a run that committed outside an outage, or returned in time, "
    "is judged as ever)",
    "untraced": "tracing is an option (`beetle_trace_dir`): a worker without it decides as "
    "any other; its messages are judged by the effect ledger (a body that returned, or "
    "called `self.retry`, completed) and the brokers' dead letters, and the audit, which "
    "reads the trace only, is not asked about them",
    "broker_replace": 'transport.md "What happens when a broker fails": a BeetleTask has a '
    "copy on two brokers, so a broker whose data is lost (an empty node in its place) loses "
    "no BeetleTask; a message with one copy there may go with it, as with `broker_destroy`",
    "early_ack_twin": 'limits.md "`acks_late=False` rests on one copy once a run begins": '
    '"Celery acks the copy a pool process takes, so a run cut short before its outcome is '
    "stored leaves only the twin on the other broker; if that broker's data is lost too "
    '(an empty node in its place, or the broker destroyed), the message is lost" (two '
    "faults for a task whose owner chose early acks: the run cut short and its twin's "
    "broker destroyed, or a broker down when it was published so that it has no twin; with "
    "`acks_late` as BeetleTask sets it, or with either fault alone, nothing is excused)",
}

#: exactly-once.md "When Redis is unavailable or fails over": "Keep the lease (`timeout`)
#: longer than a failover by a second or more (counted from the body's start to the store
#: taking writes again)": a completion waiting for the store is tried again at least every
#: half second, and another copy claims the message as the lease ends. So a completion that
#: waited in an outage that ended less than this before its lease did may lose its message.
OUTAGE_SLACK_S = 1.0

#: exactly-once.md: completions "are retried until stored, at least every half second". So
#: a completion may not be tried within a shorter pause between two outages: they are one.
OUTAGE_GAP_S = 0.5

#: the rule :func:`early_ack_twin_lost` applies (SIXTH_VERSION "early_ack_twin")
EARLY_ACK_TWIN = "early_ack_twin"

#: how long before a failover's kill (beyond the replica's drawn lag) a write the old master
#: acknowledged may still be missing on its replica
REPLICATION_SLACK_S = 1.0

#: the outcomes RabbitMQ gives a message a queue bound (FIFTH_VERSION "queues_bound") took
BOUNDED = frozenset({"dead:broker:expired", "dead:broker:maxlen"})

GIVE_UP = frozenset({"dead:attempts_limit", "dead:exceptions_limit"})


@dataclass(frozen=True)
class Expectation:
    """The outcomes a message may end with when nothing interrupted its bodies."""

    outcomes: frozenset[str]
    #: ``dead:attempts_limit`` is also allowed when every start was interrupted by a fault
    interrupted_may_die: bool = True


def expect(
    item: Item, settings: Settings, replays: int = 0, killed_first: bool = False
) -> Expectation:
    """The outcomes ``item`` may have under ``settings`` (README "What a message that cannot
    run gets", "Exactly once", the inbox), after ``replays`` replays of its dead letter;
    ``killed_first``: a fault killed the process of its first start after it began."""
    if item.kind == "inbox":
        return Expectation(frozenset({"completed"}))
    if item.kind in ("outbox", "scoped"):
        # an ``ok`` body: committed through the outbox, or published to two queues of one
        # scope (THIRD_VERSION); a rolled-back enqueue is never judged here
        return Expectation(frozenset({"completed"}))
    if item.kind == "bad":
        # README "What a message that cannot run gets": dead-lettered with the reason. A
        # message without a message_id gets one with its dead letter (README "Dead
        # letters"), so a replay runs it once under that id, and its body is an ``ok`` one
        dead = frozenset({f"dead:{item.mode}"})
        if item.mode == "no_message_id" and replays:
            return Expectation(dead | {"completed"}, interrupted_may_die=False)
        return Expectation(dead, interrupted_may_die=False)
    mode = item.mode
    if mode in ("ok", "long"):  # also a chain's first task with an ``ok`` body
        return Expectation(frozenset({"completed"}))
    if mode == "fail":
        return Expectation(GIVE_UP, interrupted_may_die=True)
    if mode == "flaky":
        # it fails on its first start only: a retry completes it; without one it is
        # dead-lettered, and a replay (README "Dead letters": a replay runs it once more,
        # with a fresh attempt budget) then completes it, the dead letter staying in the
        # trace (the explorer's seed 5011)
        if replays:
            return Expectation(frozenset({"completed"}) | GIVE_UP)
        retried = settings.exceptions >= 1 and settings.attempts >= 2
        if killed_first and settings.attempts >= 2:
            # its first start was killed before it could fail: the next start is its second
            # (the body counts its starts), which succeeds within `attempts`
            return Expectation(frozenset({"completed"}) | GIVE_UP)
        return Expectation(frozenset({"completed"}) if retried else GIVE_UP)
    if mode == "fatal":
        return Expectation(frozenset({"dead:not_retryable"}))
    if mode == "overrun":
        # prefork's hard time limit (derived from the lease) ends the body: a failure; the
        # other pools extend the lease and the body completes
        if settings.pool == "prefork":
            return Expectation(GIVE_UP | {"dead:not_retryable"})
        return Expectation(frozenset({"completed"}))
    raise ValueError(f"no rule for {item}")


def max_starts(settings: Settings, replays: int, inbox: bool = False) -> int:
    """Body starts a BeetleTask message may have: ``attempts``, again per replay (a replay
    gives a fresh attempt budget); an inbox task whose body marked its commit and was cut
    short, up to :data:`~celery_beetle.store.outcome.INBOX_EXTRA_STARTS` more (README "The inbox
    costs starts"; the explorer's seed 5066)."""
    from celery_beetle.store.outcome import INBOX_EXTRA_STARTS

    extra = INBOX_EXTRA_STARTS if inbox else 0
    return (settings.attempts + extra) * (1 + replays)


def plain_may_be_lost(worker_kills: int, broker_faults: int) -> bool:
    """A plain task is acked early (pyamqp's default): a worker killed with it prefetched or
    running, or a broker lost with it, loses it, as on pyamqp."""
    return worker_kills + broker_faults > 0


def plain_may_repeat(broker_faults: int) -> bool:
    """README "What happens when a broker fails": an ack for a broker that died is dropped
    (that broker redelivers). A broker whose link was cut, stalled or whose replies were
    held died to its clients, as on pyamqp: Celery acks a plain task before its body, and
    an ack on a connection being closed never reaches the broker."""
    return broker_faults > 0


def plain_may_outwait_the_consumer_timeout(consumer_timeout_ms: int) -> bool:
    """limits.md "Plain tasks are as on pyamqp": a plain task waiting unacked in a busy worker
    past the broker's ``consumer_timeout`` (lowered by the scenario: the default is 30 min) is
    given back when the broker closes the channel, and the worker still runs the request it
    holds."""
    return consumer_timeout_ms > 0


def failover_may_rerun(
    starts: list[float],
    ends: list[float],
    failovers: list[tuple[float, float, bool]],
    lease_s: float,
) -> bool:
    """SIXTH_VERSION "redis_failover": whether a failover without ``wait_replicas`` may
    have lost this message's claim, start or completion. A write is at risk from the
    replica's lag (``lag_s`` plus :data:`REPLICATION_SLACK_S`) before the kill until the
    kill: a body that ended then (its completion), or began then or within a lease after
    it (its claim, taken before the body, may have been lost with the master)."""
    if any(failover_may_lose_completion(ts, failovers) for ts in ends):
        return True
    for killed, lag_s, waited in failovers:
        if waited:
            continue
        since = killed - lag_s - REPLICATION_SLACK_S
        if any(since <= ts <= killed + lease_s for ts in starts):
            return True
    return False


def failover_may_lose_completion(ended: float, failovers: list[tuple[float, float, bool]]) -> bool:
    """SIXTH_VERSION "redis_failover": whether a failover without ``wait_replicas`` may
    have lost the completion of a body that ended at ``ended``: it ended within the
    replica's lag (``lag_s`` plus :data:`REPLICATION_SLACK_S`) before the kill. The start
    the old master had replicated before stays counted, so at ``attempts=1`` the next copy
    dead-letters the message (``attempts_limit``) as for a run cut short."""
    return any(
        not waited and killed - lag_s - REPLICATION_SLACK_S <= ended <= killed
        for killed, lag_s, waited in failovers
    )


def one_copy_may_be_lost(brokers_destroyed: int) -> bool:
    """A message with one copy (a plain task, a raw message) is gone with the broker that
    held it, destroyed for good (THIRD_VERSION "broker_destroy"); a BeetleTask never is."""
    return brokers_destroyed > 0


def early_ack_twin_lost(
    acks_late: bool | None,
    copies: list[tuple[float, str]],
    delivered_from: set[str],
    replacements: list[tuple[float, str]],
) -> bool:
    """SIXTH_VERSION "early_ack_twin": whether a BeetleTask with no outcome may be lost
    because its owner chose ``acks_late=False``. Per copy, from the trace: ``copies`` are its
    confirmed copies (when the publish was confirmed, the broker), ``delivered_from`` the
    brokers a worker took a copy from, ``replacements`` the ``broker_replace`` and
    ``broker_destroy`` faults (when the old node was killed, the broker). It may be lost
    only when the task acks early, a copy confirmed on a broker before that broker was
    replaced by an empty node or destroyed went with it (the twin), and a worker took the
    copy on another broker (Celery acked it as a pool process took it, before the claim and
    the body: so a run whose body never began
    counts, a message no worker took does not). The checker adds that it has no outcome
    and is not left in a queue (the run was cut short). Whether the twin was destroyed
    before or after the run began does not matter: either way two faults took both copies.
    A message published while a broker was down has no twin (a degraded publish, one
    copy): the fault at its publish took the twin, and the taken copy was its last."""
    if acks_late is not False or not copies:  # no confirmed copy traced: nothing to judge by
        return False

    def gone(when: float, broker: str) -> bool:
        return any(b == broker and when < lost_at for lost_at, b in replacements)

    for taken in delivered_from:
        # the other copies: none when the publish was degraded (a broker down then)
        twins = [(when, broker) for when, broker in copies if broker != taken]
        if all(gone(when, broker) for when, broker in twins):
            return True
    return False
