"""The aggregations the audit's summary reads off the classified per-message table.

Each is a small aggregation over the table :func:`.transforms.classify` makes, one Spark
job or a few, never a pass over the events: the counts per verdict and the totals
(:func:`totals`), how many messages were on two brokers (:func:`redundancy_coverage`),
sample message ids per bad verdict (:func:`samples`), exact latency percentiles from a
histogram (:func:`latency_percentiles`), and the timeline with the per-broker table, from
one grouping-sets pass (:func:`timeline_and_brokers`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from celery_beetle.audit.schema import BAD_VERDICTS, VERDICTS

__all__ = [
    "INEXACT",
    "LATENCY_COLUMNS",
    "REDUNDANCY_KEYS",
    "SPAN_KEYS",
    "latency_percentiles",
    "redundancy_coverage",
    "samples",
    "timeline_and_brokers",
    "totals",
    "verdict_counts",
]

#: the timeline has at most this many buckets, however long the run
TIMELINE_BUCKETS = 600


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
    lo = span[0]
    base, width_ms = _span(span, max_buckets)
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
    timeline = {"start_ms": lo, "bucket_s": width_ms // 1000, "rows": found}
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
