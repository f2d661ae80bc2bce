"""The audit's logic as pure DataFrame → DataFrame functions (no I/O, no session setup).

Shape of the computation, chosen for 10 M events on two cores:

1. :func:`parse_lines` turns raw text lines into typed events with the explicit schema and a
   ``malformed`` flag (bad JSON, wrong types, missing required fields, unknown events).
2. :func:`per_message` groups by the dedup identity ``(queue, message_id)`` **once** and computes
   every per-message fact in that single aggregation: counts per event, first/last times,
   publishing brokers, delivering brokers and the runs needed for overlap detection.
   Malformed lines ride along in the same shuffle under a null key, so counting them costs no
   second pass over the input; :func:`split_malformed` separates them afterwards.
   :func:`.numeric.per_message` computes the same facts from numbers only (Spark's compiled
   hash aggregation; the runs as numbers, not lists), and is what ``beetle audit`` uses for its
   summary; this one remains for the Parquet tables, which keep every message's runs, and
   for the rare messages the numbers cannot judge exactly.
3. :func:`classify` gives each message one verdict from those facts; everything after that
   (:func:`totals`, :func:`latency_percentiles`, :func:`timeline_and_brokers`, …) is a small
   aggregation over the per-message table.

Outbox messages (:mod:`celery_beetle.outbox`) start with ``enqueued`` at commit: one that
was never published is ``never_relayed`` (a bad verdict), one the relay set aside with a
reason is ``set_aside``; an ``enqueued`` message that completed is not ``unexpected``, even
when the relay's ``published`` events were lost with it.

A message whose ``completed`` event is missing but whose other copy was dropped as a
``duplicate`` because the store said "completed" is counted as completed once (and in
``completed_unobserved``): the kill -9 window between storing a completion and tracing it
must not read as a loss.

Clock skew: hosts' clocks differ, so the verdict never depends on the order of timestamps,
only on which events exist for a message (a ``completed`` stamped before its ``published``
is still a completion). Latencies are clamped at zero. Two runs count as overlapping only
when they overlap by more than ``skew_tolerance_ms`` (default 1000 ms): hosts must be
synchronised better than that, and overlaps shorter than it go unreported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from celery_beetle.audit.schema import (
    BAD_VERDICTS,
    CORRUPT_COLUMN,
    EVENT_SCHEMA,
    EVENTS,
    REQUIRED_FIELDS,
    VERDICTS,
)

DEFAULT_SKEW_TOLERANCE_MS = 1000
#: The run events collected per message; a run is a ``started`` and its ``completed``/``failed``.
RUN_EVENTS = ("started", "completed", "failed")
#: the events whose broker the per-message row keeps (the copy's broker)
BROKER_EVENTS = ("published", "delivered", "started", "completed")
#: the timeline has at most this many buckets, however long the run
TIMELINE_BUCKETS = 600
#: ``detail.status`` of a ``duplicate`` event when the store said "completed" ("c" is the
#: store's own code for it).
DONE_STATUS = ("completed", "c")

__all__ = [
    "DEFAULT_SKEW_TOLERANCE_MS",
    "REDUNDANCY_KEYS",
    "classify",
    "latency_percentiles",
    "mark_malformed",
    "parse_lines",
    "per_message",
    "read_options",
    "redundancy_coverage",
    "samples",
    "split_malformed",
    "timeline_and_brokers",
    "totals",
    "verdict_counts",
]


READ_SCHEMA = StructType([*EVENT_SCHEMA.fields, StructField(CORRUPT_COLUMN, StringType())])
#: The fields of a parsed malformed line that its sample text shows: all but ``task_id``,
#: which the verdict never reads (so the JSON reader can skip converting it).
LINE_FIELDS = tuple(f.name for f in EVENT_SCHEMA.fields if f.name != "task_id")


def read_options() -> dict[str, str]:
    """Options for ``spark.read.json`` that make a bad line data instead of an error."""
    return {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}


def mark_malformed(raw: DataFrame) -> DataFrame:
    """Typed events with a ``malformed`` flag, from ``spark.read.json`` with :data:`READ_SCHEMA`.

    The JSON reader in PERMISSIVE mode never fails the job: a line that is not JSON, or holds
    a value of the wrong type, comes back with its raw text in ``_corrupt_record``. Lines that
    parse but miss a required field, or name an unknown event, are malformed too. ``line``
    keeps a malformed line's text for the report's samples: its raw text when it did not
    parse, else the fields the audit reads re-rendered (:data:`LINE_FIELDS`: without
    ``task_id``, which nothing else reads; naming it would make the reader convert it on every
    line, about a tenth of the read at 10 M events).
    """
    corrupt = F.col(CORRUPT_COLUMN)
    bad = corrupt.isNotNull() | ~F.col("event").isin(*EVENTS)
    for name in REQUIRED_FIELDS:
        bad = bad | F.col(name).isNull()
    bad = F.coalesce(bad, F.lit(True))
    fields = [f.name for f in EVENT_SCHEMA.fields]
    line = F.when(bad, F.coalesce(corrupt, F.to_json(F.struct(*LINE_FIELDS))))
    return raw.select(*fields, bad.alias("malformed"), line.alias("line"))


def parse_lines(lines: DataFrame, value: str = "value") -> DataFrame:
    """:func:`mark_malformed` for lines already in a string column (tests, streams).

    The job reads files with ``spark.read.json`` instead: the same parser, without carrying
    every line's text through the plan, which measured twice as fast.
    """
    parsed = F.from_json(F.col(value), READ_SCHEMA, read_options())
    raw = lines.where(F.length(F.trim(F.col(value))) > 0).select(parsed.alias("e"))
    return mark_malformed(raw.select("e.*"))


def _code(event: str) -> int:
    """An event's number in the grouped rows (1 + its place in ``EVENTS``)."""
    return EVENTS.index(event) + 1


def _is(*events: str) -> Column:
    """True for a grouped row of one of ``events`` (the rows carry the event's number)."""
    codes = [_code(e) for e in events]
    return F.col("event") == codes[0] if len(codes) == 1 else F.col("event").isin(*codes)


def _count(event: str) -> Column:
    return F.count(F.when(_is(event), True))


def _ts(event: str) -> Column:
    return F.when(_is(event), F.col("ts_ms"))


def times_and_brokers(ts: Callable[[str], Column]) -> list[Column]:
    """The per-message aggregates of event times and the brokers of the first start and
    completion, for both groupings (:func:`per_message` and the numbers-only one of
    :mod:`celery_beetle.audit.numeric`); ``ts(event)`` is an event's time or null."""
    return [
        F.min(_ts("published")).alias("first_published_ms"),
        F.min(_ts("started")).alias("first_started_ms"),
        F.max(_ts("started")).alias("last_started_ms"),
        F.min(_ts("completed")).alias("first_completed_ms"),
        F.min_by("broker", _ts("started")).alias("started_broker"),
        F.min_by("broker", _ts("completed")).alias("completed_broker"),
        F.max(_ts("replayed")).alias("last_replayed_ms"),
        F.max(_ts("dead_lettered")).alias("last_dead_lettered_ms"),
    ]


def per_message(events: DataFrame) -> DataFrame:
    """One row per ``(queue, message_id)`` with every fact the verdict needs; one shuffle.

    The row with a null key carries the malformed-line count and two sample lines.

    Each event is cut down before the shuffle to what its kind contributes (a broker only on
    ``published``/``delivered``, a worker only on runs, ``detail`` as three flags), and the
    events are partitioned by message before they are grouped: a message's events come from
    different hosts' files, so grouping inside each input split first saves nothing and ships
    a whole aggregation buffer per event instead of a narrow row.
    """
    ok = ~F.col("malformed")
    event = F.when(ok, F.col("event"))  # a bad line must not count as an event
    detail = F.when(F.col("event").isin("published", "duplicate", "relayed"), F.col("detail"))
    published = event == "published"
    # The event travels as its number: a byte per row through the shuffle instead of its
    # name, and the aggregation's thirty-odd tests of it compare ints, not strings.
    names = F.array(*[F.lit(e) for e in EVENTS])
    keyed = events.select(
        F.when(ok, F.col("queue")).alias("queue"),
        F.when(ok, F.col("message_id")).alias("message_id"),
        F.array_position(names, event).cast("byte").alias("event"),
        "ts_ms",
        "task_name",
        F.when(event.isin(*BROKER_EVENTS), F.col("broker")).alias("broker"),
        *[F.when(event.isin(*RUN_EVENTS), F.col(c)).alias(c) for c in ("worker", "pid", "attempt")],
        (published & (detail["confirmed"] == "true")).alias("confirmed"),
        (published & (detail["redundant"] == "true")).alias("redundant"),
        ((event == "duplicate") & detail["status"].isin(*DONE_STATUS)).alias("seen_completed"),
        ((event == "relayed") & detail["aside"].isNotNull()).alias("aside"),
        "malformed",
        F.col("line").alias("bad_line"),
    ).repartition("queue", "message_id")
    published = _is("published")
    run = F.struct(
        F.element_at(names, F.col("event").cast("int")).alias("event"),
        "ts_ms",
        "attempt",
        "worker",
        "pid",
    )
    aggs = [
        F.count(F.when(F.col("malformed"), True)).alias("malformed_lines"),
        F.min("bad_line").alias("bad_line_min"),
        F.max("bad_line").alias("bad_line_max"),
        F.max("task_name").alias("task_name"),
        *[_count(e).alias(f"n_{e}") for e in EVENTS],
        F.count(F.when(F.col("confirmed"), True)).alias("n_confirmed"),
        F.max("redundant").alias("redundant"),
        F.count(F.when(F.col("seen_completed"), True)).alias("n_seen_completed"),
        F.count(F.when(F.col("aside"), True)).alias("n_aside"),
        F.collect_set(F.when(published, F.col("broker"))).alias("published_brokers"),
        F.collect_list(F.when(_is("delivered"), F.col("broker"))).alias("delivered_brokers"),
        F.collect_list(F.when(_is(*RUN_EVENTS), run)).alias("run_events"),
        *times_and_brokers(_ts),
    ]
    return keyed.groupBy("queue", "message_id").agg(*aggs)


def _bucket(column: str, lo: int, width_ms: int) -> Column:
    return F.floor((F.col(column) - F.lit(lo)) / width_ms).cast("long")


def _grouping_ids(keys: list[str], sets: Sequence[tuple[str, Sequence[str]]]) -> dict[int, str]:
    """``{grouping_id: event}`` of grouping ``sets`` over ``keys``: Spark's ``grouping_id``
    has a bit per key, set where the key is left out of the set."""
    return {
        (1 << len(keys)) - 1 - sum(1 << (len(keys) - 1 - keys.index(k)) for k in cols): event
        for event, cols in sets
    }


def timeline_and_brokers(
    classified: DataFrame,
    span: tuple[int | None, int | None],
    max_buckets: int = TIMELINE_BUCKETS,
    brokers: tuple[str, ...] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(timeline, brokers)`` in one pass over the per-message table.

    **Timeline**: messages first published (per broker they were published to), first
    started and first completed (per broker of the copy that ran), per time bucket: the
    picture of a stall after a fault and of the recovery. Buckets are a second wide, or
    wider so that there are at most ``max_buckets`` (a small table, however long the run).
    ``{"start_ms", "bucket_s", "rows": [{"bucket", "event", "broker", "messages"}]}``.

    **Brokers**: per broker, the deliveries made and the messages published to it
    (``[{"broker", "deliveries", "published_messages"}]``, by broker).

    ``span`` is (first publish, last completion) in ms, from :func:`totals`. One aggregation
    with grouping sets counts messages per (bucket, broker list) for each event and per
    delivering-broker list; a trace holds a few dozen distinct broker lists, and Python
    spreads each list's count over its brokers. No per-message ``explode`` and no lambda
    (Spark runs higher-order functions row by row, outside its generated code): at 1.45 M
    messages this pass takes about 3 s where the explodes of timeline and brokers took 8.

    With ``brokers`` (the dictionary of :func:`.numeric.per_message`), a message's brokers are
    read from its numbers (:func:`.numeric.broker_columns`) instead of its lists: a mask is
    a cheaper key than a list, and the deliveries are sums.
    """
    if brokers is not None:
        return _timeline_and_brokers_from_numbers(classified, span, max_buckets, brokers)
    lo, hi = span
    bucket_s = 1
    if lo is not None:
        hi = hi if hi is not None else lo
        bucket_s = max(1, math.ceil((hi - lo) / 1000 / max_buckets))
    width_ms = bucket_s * 1000
    base = lo if lo is not None else 0
    c = F.col
    unknown = F.lit("?")
    rows = classified.select(
        _bucket("first_published_ms", base, width_ms).alias("published_bucket"),
        "published_brokers",
        _bucket("first_started_ms", base, width_ms).alias("started_bucket"),
        F.coalesce(c("started_broker"), unknown).alias("started_broker"),
        _bucket("first_completed_ms", base, width_ms).alias("completed_bucket"),
        F.coalesce(c("completed_broker"), unknown).alias("completed_broker"),
        "delivered_brokers",
    )
    sets = [
        ("published", ("published_bucket", "published_brokers")),
        ("started", ("started_bucket", "started_broker")),
        ("completed", ("completed_bucket", "completed_broker")),
        ("delivered", ("delivered_brokers",)),
    ]
    keys = [k for _event, cols in sets for k in cols]
    grouped = rows.groupingSets([list(cols) for _event, cols in sets], *keys).agg(
        F.grouping_id().alias("_set"), F.count(F.lit(1)).alias("messages")
    )
    ids = _grouping_ids(keys, sets)
    counts: dict[tuple[int, str, str], int] = {}
    deliveries: dict[str, int] = {}
    published: dict[str, int] = {}
    for row in grouped.collect():
        event, n = ids[row["_set"]], row["messages"]
        if event == "delivered":
            for broker in row["delivered_brokers"]:
                deliveries[broker] = deliveries.get(broker, 0) + n
            continue
        bucket = row[f"{event}_bucket"]
        if event == "published":
            listed = row["published_brokers"]
            for broker in listed:
                published[broker] = published.get(broker, 0) + n
            named = [b if b is not None else "?" for b in listed] or ["?"]
        else:
            named = [row[f"{event}_broker"]]
        if bucket is None or lo is None:
            continue
        for broker in named:
            key = (bucket, event, broker)
            counts[key] = counts.get(key, 0) + n
    found = [
        {"bucket": b, "event": e, "broker": k, "messages": n}
        for (b, e, k), n in sorted(counts.items(), key=lambda kv: kv[0])
    ]
    timeline = {"start_ms": lo, "bucket_s": bucket_s, "rows": found}
    table = [
        {"broker": b, "deliveries": deliveries.get(b, 0), "published_messages": published.get(b, 0)}
        for b in sorted(set(deliveries) | set(published))
    ]
    return timeline, table


def _span(span: tuple[int | None, int | None], max_buckets: int) -> tuple[int, int]:
    """(first bucket's start, bucket width) in ms."""
    lo, hi = span
    bucket_s = 1
    if lo is not None:
        hi = hi if hi is not None else lo
        bucket_s = max(1, math.ceil((hi - lo) / 1000 / max_buckets))
    return (lo if lo is not None else 0), bucket_s * 1000


def _timeline_and_brokers_from_numbers(
    classified: DataFrame,
    span: tuple[int | None, int | None],
    max_buckets: int,
    brokers: tuple[str, ...],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """:func:`timeline_and_brokers` from a published mask and delivery counts per broker."""
    base, width_ms = _span(span, max_buckets)
    c = F.col
    unknown = F.lit("?")
    deliveries = [f"delivered_{b}" for b in range(1, len(brokers) + 1)]
    rows = classified.select(
        _bucket("first_published_ms", base, width_ms).alias("published_bucket"),
        "published_mask",
        _bucket("first_started_ms", base, width_ms).alias("started_bucket"),
        F.coalesce(c("started_broker"), unknown).alias("started_broker"),
        _bucket("first_completed_ms", base, width_ms).alias("completed_bucket"),
        F.coalesce(c("completed_broker"), unknown).alias("completed_broker"),
        *deliveries,
    )
    sets = [
        ("published", ("published_bucket", "published_mask")),
        ("started", ("started_bucket", "started_broker")),
        ("completed", ("completed_bucket", "completed_broker")),
    ]
    keys = [k for _event, cols in sets for k in cols]
    grouped = rows.groupingSets([list(cols) for _event, cols in sets], *keys).agg(
        F.grouping_id().alias("_set"),
        F.count(F.lit(1)).alias("messages"),
        *[F.sum(d).alias(d) for d in deliveries],
    )
    ids = _grouping_ids(keys, sets)
    counts: dict[tuple[int, str, str], int] = {}
    delivered: dict[str, int] = {}
    published: dict[str, int] = {}
    for row in grouped.collect():
        event, n = ids[row["_set"]], row["messages"]
        bucket = row[f"{event}_bucket"]
        if event == "published":
            # every message is in one row of this set: the deliveries are summed over them
            for name, d in zip(brokers, deliveries, strict=True):
                if row[d]:
                    delivered[name] = delivered.get(name, 0) + row[d]
            mask = row["published_mask"]
            named = [b for i, b in enumerate(brokers, start=1) if mask & (1 << i)]
            for broker in named:
                published[broker] = published.get(broker, 0) + n
            named = named or ["?"]
        else:
            named = [row[f"{event}_broker"]]
        if bucket is None or span[0] is None:
            continue
        for broker in named:
            key = (bucket, event, broker)
            counts[key] = counts.get(key, 0) + n
    found = [
        {"bucket": b, "event": e, "broker": k, "messages": n}
        for (b, e, k), n in sorted(counts.items(), key=lambda kv: kv[0])
    ]
    timeline = {"start_ms": span[0], "bucket_s": width_ms // 1000, "rows": found}
    table = [
        {"broker": b, "deliveries": delivered.get(b, 0), "published_messages": published.get(b, 0)}
        for b in sorted(set(delivered) | set(published))
    ]
    return timeline, table


def split_malformed(facts: DataFrame) -> tuple[DataFrame, DataFrame]:
    """``(messages, malformed)``: the per-message rows, and one row that counts the malformed
    lines and holds two of them.

    Malformed lines are the rows without a queue (every valid event has one): the one
    null-key row of :func:`per_message`, or a row per distinct line from
    :func:`.numeric.per_message`.
    """
    c = F.col
    is_msg = c("queue").isNotNull()
    malformed = facts.where(~is_msg).agg(
        F.coalesce(F.sum("malformed_lines"), F.lit(0)).alias("malformed_lines"),
        F.min("bad_line_min").alias("bad_line_min"),
        F.max("bad_line_max").alias("bad_line_max"),
    )
    return facts.where(is_msg), malformed


def _overlap(tolerance_ms: int) -> Column:
    """True when two runs of the message overlap by more than ``tolerance_ms``.

    A run is a ``started`` event; it ends at the earliest ``completed``/``failed`` of the same
    attempt on the same worker process (clamped to not before its start), or at its start when
    the process died without one: an unfinished run is a point, never an open interval, so a
    killed worker cannot manufacture an overlap.
    """
    tol = F.lit(tolerance_ms)
    ends = F.filter("run_events", lambda e: e["event"] != "started")

    def end_of(s: Column) -> Column:
        mine = F.filter(
            ends,
            lambda e: (
                e["attempt"].eqNullSafe(s["attempt"])
                & e["worker"].eqNullSafe(s["worker"])
                & e["pid"].eqNullSafe(s["pid"])
            ),
        )
        return F.greatest(
            F.coalesce(F.array_min(F.transform(mine, lambda e: e["ts_ms"])), s["ts_ms"]), s["ts_ms"]
        )

    starts = F.filter("run_events", lambda e: e["event"] == "started")
    runs = F.transform(
        starts, lambda s, i: F.struct(i.alias("i"), s["ts_ms"].alias("s"), end_of(s).alias("e"))
    )
    return F.exists(
        runs,
        lambda a: F.exists(
            runs,
            lambda b: (
                (a["i"] < b["i"]) & (F.least(a["e"], b["e"]) - F.greatest(a["s"], b["s"]) > tol)
            ),
        ),
    )


def classify(messages: DataFrame, skew_tolerance_ms: int = DEFAULT_SKEW_TOLERANCE_MS) -> DataFrame:
    """Add ``overlap``, ``verdict`` and the clamped latencies to the per-message facts."""
    c = F.col
    if "run_events" in messages.columns:
        overlap = F.when(c("n_started") > 1, _overlap(skew_tolerance_ms)).otherwise(F.lit(False))
    else:  # numbers only (:func:`.numeric.per_message`): the largest overlap of two runs
        overlap = F.coalesce(c("run_overlap_ms") > skew_tolerance_ms, F.lit(False))
    # A worker killed between storing its completion and writing the ``completed`` event
    # leaves no event, but the other copy's ``duplicate`` says the store holds "completed".
    unobserved = (c("n_completed") == 0) & (c("n_seen_completed") > 0)
    with_overlap = messages.withColumn("overlap", overlap).withColumn(
        "completion_unobserved", unobserved
    )
    completed = (c("n_completed") == 1) | c("completion_unobserved")
    replayed = c("n_replayed") > 0
    # a replay's run that never ended (no completion, no dead letter after the replay)
    replay_unfinished = replayed & (
        c("last_dead_lettered_ms").isNull() | (c("last_dead_lettered_ms") < c("last_replayed_ms"))
    )
    verdict = (
        F.when(
            (c("n_completed") > 0) & (c("n_published") == 0) & (c("n_enqueued") == 0) & ~replayed,
            "unexpected",
        )
        .when((c("n_completed") > 1) | c("overlap"), "duplicated")
        .when(replayed & completed, "replayed")
        .when(completed, "completed_once")
        .when(replay_unfinished, "lost")
        .when(c("n_dead_lettered") > 0, "dead_lettered")
        .when(c("n_expired") > 0, "expired")
        .when(c("n_failed") > c("n_retried"), "failed")
        .when((c("n_aside") > 0) & (c("n_published") == 0), "set_aside")
        .when((c("n_enqueued") > 0) & (c("n_published") == 0), "never_relayed")
        .when(c("n_confirmed") > 0, "lost")
        .when(c("n_published") > 0, "unconfirmed")
        .otherwise("untracked")
    )

    if "published_mask" in messages.columns:  # numbers only: bit i for the i-th broker
        n_brokers = F.bit_count("published_mask").cast("int")
    else:
        n_brokers = F.size("published_brokers")

    def clamp(a: str, b: str) -> Column:
        # greatest() skips nulls, so guard: a message never started has no latency, not 0.
        return F.when(c(a).isNotNull() & c(b).isNotNull(), F.greatest(c(b) - c(a), F.lit(0)))

    return with_overlap.select(
        "*",
        verdict.alias("verdict"),
        n_brokers.alias("n_published_brokers"),
        clamp("first_published_ms", "first_started_ms").alias("publish_to_start_ms"),
        clamp("last_started_ms", "first_completed_ms").alias("start_to_complete_ms"),
        clamp("first_published_ms", "first_completed_ms").alias("publish_to_complete_ms"),
    )


REDUNDANCY_KEYS = ("redundant_messages", "on_two_or_more_brokers", "on_one_broker")


#: ``totals``' extra keys: the first publish and the last completion, in ms (or None), for
#: the timeline's span
SPAN_KEYS = ("span_first_published_ms", "span_last_completed_ms")
#: ``totals``' count of messages :func:`.numeric.per_message` could not judge exactly (when
#: the table has its ``exact`` column)
INEXACT = "inexact_messages"


def totals(classified: DataFrame) -> dict[str, Any]:
    """Every whole-trace count in one pass: verdicts, retries and redundancy coverage, and
    the run's span (:data:`SPAN_KEYS`)."""
    c = F.col
    exact = "exact" in classified.columns
    row = classified.agg(
        F.count(F.lit(1)).alias("messages"),
        *[F.count(F.when(c("verdict") == v, True)).alias(v) for v in VERDICTS],
        F.count(F.when(c("completion_unobserved"), True)).alias("completed_unobserved"),
        F.count(F.when(c("n_retried") > 0, True)).alias("retried_messages"),
        F.coalesce(F.sum("n_retried"), F.lit(0)).alias("retries"),
        F.count(F.when(c("redundant"), True)).alias("redundant_messages"),
        F.count(F.when(c("redundant") & (c("n_published_brokers") >= 2), True)).alias(
            "on_two_or_more_brokers"
        ),
        F.count(F.when(c("redundant") & (c("n_published_brokers") == 1), True)).alias(
            "on_one_broker"
        ),
        F.min("first_published_ms").alias(SPAN_KEYS[0]),
        F.max("first_completed_ms").alias(SPAN_KEYS[1]),
        *([F.count(F.when(~c("exact"), True)).alias(INEXACT)] if exact else []),
    ).first()
    assert row is not None
    values = row.asDict()
    out = {k: int(v or 0) for k, v in values.items() if k not in SPAN_KEYS}
    out.update({k: values[k] for k in SPAN_KEYS})  # None when nothing was published
    return out


def verdict_counts(classified: DataFrame) -> dict[str, int]:
    """Counts per verdict plus retry totals, from the classified per-message table."""
    skipped = (*REDUNDANCY_KEYS, *SPAN_KEYS, INEXACT)
    return {k: v for k, v in totals(classified).items() if k not in skipped}


def redundancy_coverage(classified: DataFrame) -> dict[str, int]:
    """How many redundant publishes really reached two or more brokers, and how many one.

    A redundant publish lands on one broker when only one was alive (the transport flags it);
    many of those mean the fleet ran without its safety margin.
    """
    return {k: v for k, v in totals(classified).items() if k in REDUNDANCY_KEYS}


def samples(
    classified: DataFrame, per_class: int = 5, counts: dict[str, int] | None = None
) -> dict[str, list[str]]:
    """The first ``queue/message_id`` of each bad class (in that order), for a person to look
    up; one pass. ``counts`` (verdict → messages, :func:`totals`) skips the pass when no
    message is bad.

    A window's row number, filtered, keeps only ``per_class`` rows per class in each task
    before the shuffle (Spark's group limit): one scan, where a ``limit`` per class scanned
    the table once per class, and a rare class most of it each time.
    """
    out: dict[str, list[str]] = {v: [] for v in BAD_VERDICTS}
    wanted = [v for v in BAD_VERDICTS if counts is None or counts.get(v)]
    if not wanted:
        return out
    ids = F.concat_ws("/", "queue", "message_id").alias("id")
    bad = classified.where(F.col("verdict").isin(*wanted)).select("verdict", ids)
    first = Window.partitionBy("verdict").orderBy("id")
    rows = bad.withColumn("n", F.row_number().over(first)).where(F.col("n") <= per_class)
    for row in sorted(rows.collect(), key=lambda r: (r["verdict"], r["n"])):
        out[row["verdict"]].append(row["id"])
    return out


LATENCY_COLUMNS = ("publish_to_start_ms", "start_to_complete_ms", "publish_to_complete_ms")
#: Latencies are counted exactly below this many ms, and above it to this many significant
#: bits (a relative error under 0.1 %, as ``percentile_approx``'s default accuracy): a
#: histogram of a few thousand values per task and queue, however many messages.
EXACT_BELOW_MS = 1024
SIGNIFICANT_BITS = 10


def _quantised(column: str) -> Column:
    """The value rounded down to :data:`SIGNIFICANT_BITS` bits when it is large."""
    v = F.col(column)
    drop = (F.floor(F.log2(v)) + 1 - SIGNIFICANT_BITS).cast("int")
    rounded = F.call_function("shiftleft", F.call_function("shiftright", v, drop), drop)
    return F.when(v < EXACT_BELOW_MS, v).otherwise(rounded)


def latency_percentiles(
    classified: DataFrame, percentiles: tuple[float, ...] = (0.5, 0.9, 0.99)
) -> list[dict[str, Any]]:
    """Latency percentiles per (task_name, queue), and overall (task_name = queue = '*').

    One aggregation counts the completed messages per latency value (:func:`_quantised`),
    task and queue; the percentiles are read off those counts here, and merged for the
    overall row. That is exact (to the histogram's rounding), where ``percentile_approx``
    merged sketches and cost 5.5 s at 1.45 M messages; this costs about 2 s.
    The p-th percentile is the smallest value with at least ``ceil(p * n)`` values at or
    below it, as ``percentile_approx`` defines it.
    """
    done = classified.where(F.col("n_completed") > 0)
    stacked = done.select(
        F.coalesce("task_name", F.lit("?")).alias("task_name"),
        "queue",
        F.explode(
            F.array(
                # k = -1 counts the message; 0, 1, 2 carry its latencies
                F.struct(F.lit(-1).alias("k"), F.lit(None).cast("long").alias("v")),
                *[
                    F.struct(F.lit(i).alias("k"), _quantised(col).alias("v"))
                    for i, col in enumerate(LATENCY_COLUMNS)
                ],
            )
        ).alias("x"),
    ).select("task_name", "queue", "x.k", "x.v")
    counted = stacked.groupBy("task_name", "queue", "k", "v").agg(F.count(F.lit(1)).alias("n"))
    histograms: dict[tuple[str, str], list[dict[int, int]]] = {}
    completed: dict[tuple[str, str], int] = {}
    for row in counted.collect():
        key = (row["task_name"], row["queue"])
        if row["k"] < 0:
            completed[key] = completed.get(key, 0) + row["n"]
            continue
        if row["v"] is None:
            continue
        series = histograms.setdefault(key, [{} for _ in LATENCY_COLUMNS])[row["k"]]
        series[row["v"]] = series.get(row["v"], 0) + row["n"]

    def figures(name: str, queue: str, n: int, series: list[dict[int, int]]) -> dict[str, Any]:
        out: dict[str, Any] = {"task_name": name, "queue": queue, "completed": n}
        for col, counts in zip(LATENCY_COLUMNS, series, strict=True):
            values = _percentiles(counts, percentiles)
            for p, value in zip(percentiles, values, strict=True):
                out[f"{col.removesuffix('_ms')}_p{round(p * 100)}_ms"] = value
        return out

    empty: list[dict[int, int]] = [{} for _ in LATENCY_COLUMNS]
    rows = [
        figures(name, queue, n, histograms.get((name, queue), empty))
        for (name, queue), n in sorted(completed.items())
    ]
    overall: list[dict[int, int]] = [{} for _ in LATENCY_COLUMNS]
    for series in histograms.values():
        for merged, counts in zip(overall, series, strict=True):
            for value, n in counts.items():
                merged[value] = merged.get(value, 0) + n
    if completed:
        rows.append(figures("*", "*", sum(completed.values()), overall))
    return rows


def _percentiles(counts: dict[int, int], percentiles: tuple[float, ...]) -> list[int | None]:
    """The percentiles of a histogram (value → count); None for each when it is empty."""
    total = sum(counts.values())
    if not total:
        return [None] * len(percentiles)
    ranks = [max(1, math.ceil(p * total)) for p in percentiles]
    out: list[int | None] = [None] * len(percentiles)
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        for i, rank in enumerate(ranks):
            if out[i] is None and seen >= rank:
                out[i] = value
        if out[-1] is not None and all(v is not None for v in out):
            break
    return out
