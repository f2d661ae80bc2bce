"""The per-message facts from numbers only: Spark's compiled hash aggregation, no lists.

:func:`.transforms.per_message` keeps each message's brokers and runs as lists
(``collect_list``/``collect_set``), and any list turns Spark's compiled hash aggregation into
its object hash aggregation: at 10 M events that grouping took 40 s, the same grouping
without lists and strings 16 s. Here every aggregation buffer is a number:

* a broker or task name crosses the shuffle as its place in a sampled dictionary
  (:mod:`.names`); the brokers a message was published to are the bits of a mask, its
  deliveries a counter per broker, its task the largest code (the names are sorted, so that
  is the largest name, as ``max(task_name)`` was);
* overlap detection needs each run's end, the earliest ``completed``/``failed`` of the same
  attempt on the same worker process. So the events are grouped twice, both times by compiled
  aggregation and in the one shuffle: first by message and run identity (``attempt``,
  ``worker``, ``pid``; null-safe, as the list-based rule matches them), which gives each run
  its starts and its end, then by message. For at most two runs of at most two starts each,
  the largest overlap is a formula of those numbers (:func:`per_message`);
* a malformed line rides along keyed by its own text (with no queue), so the lines and the
  two samples come out of the same grouping as numbers too.

A message this cannot judge exactly is marked ``exact = false``: a name the sample missed,
three or more runs, or a run started three times. :func:`.job.run_audit` judges those again
from their events with the lists; they are rare, and a trace without them is never read twice.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from celery_beetle.audit.names import Names
from celery_beetle.audit.schema import EVENTS
from celery_beetle.audit.transforms import (
    BROKER_EVENTS,
    DONE_STATUS,
    RUN_EVENTS,
    times_and_brokers,
)

__all__ = ["broker_columns", "per_message", "with_broker_lists"]


def _code(event: str) -> int:
    return EVENTS.index(event) + 1


def _is(*events: str) -> Column:
    codes = [_code(e) for e in events]
    return F.col("event") == codes[0] if len(codes) == 1 else F.col("event").isin(*codes)


def _ts(*events: str) -> Column:
    return F.when(_is(*events), F.col("ts_ms"))


def _names(values: tuple[str, ...]) -> Column:
    return F.array(*[F.lit(v) for v in values]).cast("array<string>")


def _keyed(events: DataFrame, names: Names) -> DataFrame:
    """Each event cut down to numbers (but its key), partitioned by message."""
    ok = ~F.col("malformed")
    event = F.when(ok, F.col("event"))
    detail = F.when(F.col("event").isin("published", "duplicate", "relayed"), F.col("detail"))
    published = event == "published"
    run = F.coalesce(event.isin(*RUN_EVENTS), F.lit(False))
    broker = F.array_position(_names(names.brokers), F.col("broker"))
    task = F.array_position(_names(names.tasks), F.col("task_name"))
    return events.select(
        F.when(ok, F.col("queue")).alias("queue"),
        # a malformed line is keyed by its text, with no queue: its lines are counted per text
        F.when(ok, F.col("message_id")).otherwise(F.col("line")).alias("message_id"),
        run.alias("run"),
        *[F.when(run, F.col(c)).alias(c) for c in ("attempt", "worker", "pid")],
        F.array_position(F.array(*[F.lit(e) for e in EVENTS]), event).cast("byte").alias("event"),
        "ts_ms",
        F.when(ok, task).cast("short").alias("task"),
        F.when(event.isin(*BROKER_EVENTS), broker).cast("byte").alias("broker"),
        (published & (detail["confirmed"] == "true")).alias("confirmed"),
        (published & (detail["redundant"] == "true")).alias("redundant"),
        ((event == "duplicate") & detail["status"].isin(*DONE_STATUS)).alias("seen_completed"),
        ((event == "relayed") & detail["aside"].isNotNull()).alias("aside"),
    ).repartition("queue", "message_id")


def _count(cond: Column) -> Column:
    return F.count(F.when(cond, True))


def per_message(events: DataFrame, names: Names) -> DataFrame:
    """One row per ``(queue, message_id)`` with the facts :func:`.transforms.classify` reads,
    and one per distinct malformed line (no queue; ``malformed_lines`` counts it).

    Instead of ``run_events`` a message has ``run_overlap_ms``, the largest overlap of two of
    its runs (null with fewer than two starts), and ``exact``. Two runs overlap by
    ``min(end) - max(start)``, an unfinished run ending at its start; a run started twice
    overlaps itself by its end minus its later start. With two runs, the run started earlier
    of the two is the one whose interval counts (a later start of the same run ends at the same
    end and covers less), so the pair's overlap is ``min(ends) - max(first starts)``. A positive
    figure is exact; a figure at or below zero is some pair's, and no pair overlaps by more, so
    ``run_overlap_ms > tolerance`` is the list-based rule for any tolerance of zero or more.
    """
    keyed = _keyed(events, names)
    c = F.col
    brokers = range(1, len(names.brokers) + 1)
    unknown = (c("task") == 0) | (c("broker") == 0)
    ends = _ts("completed", "failed")
    bit = F.call_function("shiftleft", F.lit(1).cast("long"), c("broker"))
    runs = keyed.groupBy("queue", "message_id", "run", "attempt", "worker", "pid").agg(
        F.count(F.lit(1)).alias("lines"),
        *[_count(_is(e)).alias(f"n_{e}") for e in EVENTS],
        _count(c("confirmed")).alias("n_confirmed"),
        F.max("redundant").alias("redundant"),
        _count(c("seen_completed")).alias("n_seen_completed"),
        _count(c("aside")).alias("n_aside"),
        F.max("task").alias("task"),
        F.max(F.coalesce(unknown, F.lit(False))).alias("unknown"),
        F.bit_or(F.when(_is("published"), bit)).alias("published"),
        *[_count(_is("delivered") & (c("broker") == b)).alias(f"delivered_{b}") for b in brokers],
        *times_and_brokers(_ts),
        F.min(ends).alias("end_ms"),
    )
    started = c("run") & (c("n_started") > 0)
    start, end = c("first_started_ms"), c("end_ms")
    span_end = F.greatest(F.coalesce(end, start), start)  # an unfinished run ends at its start
    counts = [f"n_{e}" for e in EVENTS] + ["n_confirmed", "n_seen_completed", "n_aside"]
    facts = runs.groupBy("queue", "message_id").agg(
        F.sum("lines").alias("lines"),
        *[F.sum(k).alias(k) for k in counts],
        F.max("redundant").alias("redundant"),
        F.max("task").alias("task"),
        F.max("unknown").alias("unknown"),
        F.bit_or("published").alias("published"),
        *[F.sum(f"delivered_{b}").alias(f"delivered_{b}") for b in brokers],
        F.min("first_published_ms").alias("first_published_ms"),
        F.min("first_started_ms").alias("first_started_ms"),
        F.max("last_started_ms").alias("last_started_ms"),
        F.min("first_completed_ms").alias("first_completed_ms"),
        F.min_by("started_broker", "first_started_ms").alias("started_broker"),
        F.min_by("completed_broker", "first_completed_ms").alias("completed_broker"),
        F.max("last_replayed_ms").alias("last_replayed_ms"),
        F.max("last_dead_lettered_ms").alias("last_dead_lettered_ms"),
        _count(started).alias("runs"),
        F.max(F.when(started, c("n_started"))).alias("most_starts"),
        # a run started twice overlaps itself from its later start to its end
        F.max(F.when(started & (c("n_started") == 2), end - c("last_started_ms"))).alias("self"),
        F.min(F.when(started, span_end)).alias("first_end"),
        F.max(F.when(started, start)).alias("last_start"),
    )
    return _decoded(facts, names)


def broker_columns(names: Names) -> list[str]:
    """A message's brokers as numbers: the mask of those it was published to (bit ``i`` for
    the ``i``-th name, from 1) and its deliveries per broker."""
    return ["published_mask", *[f"delivered_{b}" for b in range(1, len(names.brokers) + 1)]]


def with_broker_lists(facts: DataFrame, names: Names) -> DataFrame:
    """``published_brokers`` and ``delivered_brokers`` as :func:`.transforms.per_message`
    lists them (in the dictionary's order), from :func:`broker_columns`."""
    c = F.col
    # concatenated arrays, not array_compact or filter: those are lambdas, run row by row
    none = F.array().cast("array<string>")
    published = F.concat(
        none,
        *[
            F.when(c("published_mask").bitwiseAND(1 << b) != 0, F.array(F.lit(n))).otherwise(none)
            for b, n in enumerate(names.brokers, start=1)
        ],
    )
    delivered = F.concat(
        none,
        *[
            F.array_repeat(F.lit(n), c(f"delivered_{b}").cast("int"))
            for b, n in enumerate(names.brokers, start=1)
        ],
    )
    return facts.withColumns({"published_brokers": published, "delivered_brokers": delivered})


def _decoded(facts: DataFrame, names: Names) -> DataFrame:
    """Names back from their codes, the overlap figure and ``exact``; the malformed rows."""
    c = F.col
    bad = c("queue").isNull()

    def name(code: str, values: tuple[str, ...]) -> Column:
        return F.when(c(code) > 0, F.element_at(_names(values), c(code).cast("int")))

    overlap = F.greatest(c("self"), F.when(c("runs") == 2, c("first_end") - c("last_start")))
    exact = ~c("unknown") & (c("runs") <= 2) & F.coalesce(c("most_starts") <= 2, F.lit(True))
    counts = [f"n_{e}" for e in EVENTS] + ["n_confirmed"]
    mask = c("published").bitwiseAND(F.lit(-2).cast("long"))  # bit 0: a name not sampled
    deliveries = broker_columns(names)[1:]
    decoded = facts.select(
        "queue",
        "message_id",
        F.when(bad, c("lines")).otherwise(0).alias("malformed_lines"),
        F.when(bad, c("message_id")).alias("bad_line_min"),
        F.when(bad, c("message_id")).alias("bad_line_max"),
        name("task", names.tasks).alias("task_name"),
        *counts,
        "redundant",
        "n_seen_completed",
        "n_aside",
        F.coalesce(mask, F.lit(0).cast("long")).alias("published_mask"),
        *deliveries,
        "first_published_ms",
        "first_started_ms",
        "last_started_ms",
        "first_completed_ms",
        name("started_broker", names.brokers).alias("started_broker"),
        name("completed_broker", names.brokers).alias("completed_broker"),
        "last_replayed_ms",
        "last_dead_lettered_ms",
        F.when(c("n_started") > 1, overlap).alias("run_overlap_ms"),
        exact.alias("exact"),
    )
    return with_broker_lists(decoded, names)
