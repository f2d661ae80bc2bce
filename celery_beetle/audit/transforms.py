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
   is a small aggregation over the per-message table (:mod:`.aggregates`: the totals, the
   latency percentiles, the timeline and the broker table, ...).

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

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from celery_beetle.audit.schema import (
    CORRUPT_COLUMN,
    EVENT_SCHEMA,
    EVENTS,
    REQUIRED_FIELDS,
)

DEFAULT_SKEW_TOLERANCE_MS = 1000
#: The run events collected per message; a run is a ``started`` and its ``completed``/``failed``.
RUN_EVENTS = ("started", "completed", "failed")
#: the events whose broker the per-message row keeps (the copy's broker)
BROKER_EVENTS = ("published", "delivered", "started", "completed")
#: ``detail.status`` of a ``duplicate`` event when the store said "completed" ("c" is the
#: store's own code for it).
DONE_STATUS = ("completed", "c")

__all__ = [
    "DEFAULT_SKEW_TOLERANCE_MS",
    "classify",
    "mark_malformed",
    "parse_lines",
    "per_message",
    "read_options",
    "split_malformed",
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
