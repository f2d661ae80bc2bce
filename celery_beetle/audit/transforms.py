"""The audit's logic as pure DataFrame → DataFrame functions (no I/O, no session setup).

Shape of the computation, chosen for 10 M events on two cores:

1. :func:`parse_lines` turns raw text lines into typed events with the explicit schema and a
   ``malformed`` flag (bad JSON, wrong types, missing required fields, unknown events).
2. :func:`per_message` groups by the dedup identity ``(queue, message_id)`` **once** and computes
   every per-message fact in that single aggregation: counts per event, first/last times,
   publishing brokers, delivering brokers and the runs needed for overlap detection.
   Malformed lines ride along in the same shuffle under a null key, so counting them costs no
   second pass over the input; :func:`split_malformed` separates them afterwards.
3. :func:`classify` gives each message one verdict from those facts; everything after that
   (:func:`verdict_counts`, :func:`latency_percentiles`, :func:`broker_deliveries`, …) is a small
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
    "broker_deliveries",
    "classify",
    "latency_percentiles",
    "mark_malformed",
    "parse_lines",
    "per_message",
    "read_options",
    "redundancy_coverage",
    "samples",
    "split_malformed",
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


def _count(event: str) -> Column:
    return F.count(F.when(F.col("event") == event, True))


def _ts(event: str) -> Column:
    return F.when(F.col("event") == event, F.col("ts_ms"))


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
    keyed = events.select(
        F.when(ok, F.col("queue")).alias("queue"),
        F.when(ok, F.col("message_id")).alias("message_id"),
        event.alias("event"),
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
    published = F.col("event") == "published"
    run = F.struct("event", "ts_ms", "attempt", "worker", "pid")
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
        F.collect_list(F.when(F.col("event") == "delivered", F.col("broker"))).alias(
            "delivered_brokers"
        ),
        F.collect_list(F.when(F.col("event").isin(*RUN_EVENTS), run)).alias("run_events"),
        F.min(_ts("published")).alias("first_published_ms"),
        F.min(_ts("started")).alias("first_started_ms"),
        F.max(_ts("started")).alias("last_started_ms"),
        F.min(_ts("completed")).alias("first_completed_ms"),
        F.min_by("broker", _ts("started")).alias("started_broker"),
        F.min_by("broker", _ts("completed")).alias("completed_broker"),
        F.max(_ts("replayed")).alias("last_replayed_ms"),
        F.max(_ts("dead_lettered")).alias("last_dead_lettered_ms"),
    ]
    return keyed.groupBy("queue", "message_id").agg(*aggs)


def timeline(
    classified: DataFrame,
    max_buckets: int = TIMELINE_BUCKETS,
    span: tuple[int | None, int | None] | None = None,
) -> dict[str, Any]:
    """Messages first published (per broker they were published to), first started and
    first completed (per broker of the copy that ran), per time bucket: the picture of a
    stall after a fault and of the recovery. Buckets are a second wide, or wider so that
    there are at most ``max_buckets`` (a small table, whatever the length of the run).

    ``span``: (first publish, last completion) in ms when the caller has them already
    (:func:`totals` does); otherwise one more pass finds them. The buckets themselves take
    one pass: each message becomes its entries (one per broker published to, its start, its
    completion), exploded and counted.

    ``{"start_ms", "bucket_s", "rows": [{"bucket", "event", "broker", "messages"}]}``.
    """
    c = F.col
    if span is None:
        extent = classified.agg(
            F.min("first_published_ms").alias("lo"), F.max("first_completed_ms").alias("hi")
        ).first()
        span = (extent["lo"], extent["hi"]) if extent is not None else (None, None)
    lo, hi = span
    if lo is None:
        return {"start_ms": None, "bucket_s": 1, "rows": []}
    hi = hi if hi is not None else lo
    bucket_s = max(1, math.ceil((hi - lo) / 1000 / max_buckets))
    width_ms = bucket_s * 1000

    def entry(column: str, event: str, broker: Column) -> Column:
        bucket = F.floor((c(column) - F.lit(lo)) / width_ms).cast("long")
        return F.struct(
            bucket.alias("bucket"),
            F.lit(event).alias("event"),
            broker.cast("string").alias("broker"),
        )

    no_broker = F.array(F.lit(None).cast("string"))  # as explode_outer of an empty list
    brokers = F.when(F.size("published_brokers") > 0, c("published_brokers")).otherwise(no_broker)
    unknown = F.lit("?")
    entries = F.concat(
        F.transform(brokers, lambda broker: entry("first_published_ms", "published", broker)),
        F.array(entry("first_started_ms", "started", F.coalesce(c("started_broker"), unknown))),
        F.array(
            entry("first_completed_ms", "completed", F.coalesce(c("completed_broker"), unknown))
        ),
    )
    events = (
        classified.select(F.explode(entries).alias("e"))
        .select("e.*")
        .where(c("bucket").isNotNull())
    )
    rows = events.groupBy("bucket", "event", "broker").agg(F.count(F.lit(1)).alias("messages"))
    found = sorted(
        (r.asDict() for r in rows.collect()),
        key=lambda r: (r["bucket"], r["event"], str(r["broker"])),
    )
    for row in found:
        row["broker"] = row["broker"] if row["broker"] is not None else "?"
    return {"start_ms": lo, "bucket_s": bucket_s, "rows": found}


def split_malformed(facts: DataFrame) -> tuple[DataFrame, DataFrame]:
    """``(messages, malformed)``: the per-message rows, and the one null-key malformed row."""
    is_msg = F.col("message_id").isNotNull()
    return facts.where(is_msg), facts.where(~is_msg).select(
        "malformed_lines", "bad_line_min", "bad_line_max"
    )


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
    overlap = F.when(c("n_started") > 1, _overlap(skew_tolerance_ms)).otherwise(F.lit(False))
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

    def clamp(a: str, b: str) -> Column:
        # greatest() skips nulls, so guard: a message never started has no latency, not 0.
        return F.when(c(a).isNotNull() & c(b).isNotNull(), F.greatest(c(b) - c(a), F.lit(0)))

    return with_overlap.select(
        "*",
        verdict.alias("verdict"),
        F.size("published_brokers").alias("n_published_brokers"),
        clamp("first_published_ms", "first_started_ms").alias("publish_to_start_ms"),
        clamp("last_started_ms", "first_completed_ms").alias("start_to_complete_ms"),
        clamp("first_published_ms", "first_completed_ms").alias("publish_to_complete_ms"),
    )


REDUNDANCY_KEYS = ("redundant_messages", "on_two_or_more_brokers", "on_one_broker")


#: ``totals``' extra keys: the first publish and the last completion, in ms (or None), for
#: the timeline's span
SPAN_KEYS = ("span_first_published_ms", "span_last_completed_ms")


def totals(classified: DataFrame) -> dict[str, Any]:
    """Every whole-trace count in one pass: verdicts, retries and redundancy coverage, and
    the run's span (:data:`SPAN_KEYS`)."""
    c = F.col
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
    ).first()
    assert row is not None
    values = row.asDict()
    out = {k: int(v or 0) for k, v in values.items() if k not in SPAN_KEYS}
    out.update({k: values[k] for k in SPAN_KEYS})  # None when nothing was published
    return out


def verdict_counts(classified: DataFrame) -> dict[str, int]:
    """Counts per verdict plus retry totals, from the classified per-message table."""
    skipped = (*REDUNDANCY_KEYS, *SPAN_KEYS)
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


def latency_percentiles(
    classified: DataFrame, percentiles: tuple[float, ...] = (0.5, 0.9, 0.99)
) -> DataFrame:
    """Latency percentiles per (task_name, queue) and overall (task_name = queue = '*').

    Both levels in one aggregation (grouping sets): one scan of the table, not one per level.
    """
    cols = ("publish_to_start_ms", "start_to_complete_ms", "publish_to_complete_ms")
    done = classified.where(F.col("n_completed") > 0).select(
        F.coalesce("task_name", F.lit("?")).alias("task_name"), "queue", *cols
    )
    aggs = [F.count(F.lit(1)).alias("completed")]
    for col in cols:
        pct = F.percentile_approx(col, list(percentiles), 1000)
        for k, p in enumerate(percentiles):
            aggs.append(pct[k].alias(f"{col.removesuffix('_ms')}_p{round(p * 100)}_ms"))
    keys = (F.col("task_name"), F.col("queue"))
    levels = done.groupingSets([keys, []], *keys).agg(F.grouping_id().alias("_overall"), *aggs)
    star = F.col("_overall") > 0
    return levels.select(
        F.when(star, F.lit("*")).otherwise(F.col("task_name")).alias("task_name"),
        F.when(star, F.lit("*")).otherwise(F.col("queue")).alias("queue"),
        *[a for a in levels.columns if a not in ("task_name", "queue", "_overall")],
    )


def broker_deliveries(classified: DataFrame) -> DataFrame:
    """Per broker: deliveries made, and messages published to it (unordered; a few rows).

    One explode of both lists and one aggregation: a join of two aggregations and a global
    sort would cost two more shuffles and a sampling job for a table of three rows.
    """

    def tagged(column: str, kind: str) -> Column:
        return F.transform(column, lambda b: F.struct(b.alias("broker"), F.lit(kind).alias("k")))

    pairs = classified.select(
        F.explode(
            F.concat(tagged("delivered_brokers", "d"), tagged("published_brokers", "p"))
        ).alias("x")
    ).select("x.broker", "x.k")
    return pairs.groupBy("broker").agg(
        F.count(F.when(F.col("k") == "d", True)).alias("deliveries"),
        F.count(F.when(F.col("k") == "p", True)).alias("published_messages"),
    )
