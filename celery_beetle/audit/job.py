"""Spark wiring and I/O for the delivery audit; the logic lives in :mod:`.transforms`.

Runs under ``beetle audit`` (a local session, ``local[*]`` unless ``--master`` says otherwise)
or under ``spark-submit`` on any cluster::

    spark-submit --master yarn celery_beetle/audit/job.py s3a://bucket/traces/ s3a://bucket/out

Input is any path or glob Hadoop can read (``file:``, ``hdfs:``, ``s3a:``; ``.gz`` files are
decompressed). Output under ``out``:

``summary.json``, ``report.html``
    The verdict as counts (what the exit status is based on), and the report for people.
    The report's plots are drawn from the summary's aggregates, never from rows.

With ``tables=True`` (``beetle audit --tables``), also Parquet tables:

``messages/verdict=<class>/``
    Parquet, one row per message with every per-message fact, partitioned by verdict so each
    class is a table of its own. ``verdict=malformed`` holds a single row: the count of
    malformed lines and two sample lines.
``latency/``, ``brokers/``
    Parquet: latency percentiles per task and queue; deliveries and publishes per broker.

The input is read once. The grouping (one shuffle; numbers only, :mod:`.numeric`, unless
the tables are asked for) fills a cache of the per-message rows, in memory and spilled to
local disk beyond it, so memory stays bounded whatever the trace's size; every figure after
it is a small query over that cache, and the tables, when asked for, are written once from
it after the verdict is known. The rare messages the numbers cannot judge exactly (a name the
sample of the input missed, three runs) are judged again from their events, which reads the
input a second time when there are any.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark import SparkContext, StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from celery_beetle.audit import aggregates, class_cache, names, numeric, quiet, report, transforms
from celery_beetle.audit.schema import BAD_VERDICTS, SUMMARY_COUNTS

__all__ = ["AuditResult", "build_session", "local_input_bytes", "main", "run_audit"]

MALFORMED_PARTITION = "malformed"
#: Input per partition of the one shuffle. The grouping holds a partition's messages as JVM
#: objects (about 3 KB each) until its task ends: at 128 MiB (60,000 messages a task) they
#: outlived young collections, and 10 M events spent 22.8 s of task time in GC; at 32 MiB,
#: 6-7 s (its CPU time rose somewhat: more, smaller tasks).
SHUFFLE_BYTES_PER_PARTITION = 32 * 1024 * 1024
#: Set by :func:`build_session` when the caller chose the shuffle partitions itself.
SHUFFLE_PARTITIONS_SET = "spark.beetle.audit.shufflePartitionsSet"
#: Keys an aggregation keeps in a hash map before it sorts instead. Spark's default (128)
#: makes the per-message grouping sort every partition; one partition of 32 MiB of input
#: holds about 15,000 messages, so this keeps it hashed, and memory per task stays bounded.
HASH_AGGREGATE_KEYS = "spark.sql.objectHashAggregate.sortBased.fallbackThreshold"
HASH_AGGREGATE_MAX_KEYS = 131_072
#: The per-message columns the summary reads (the cache holds only these without tables).
SUMMARY_COLUMNS = (
    "queue",
    "message_id",
    "task_name",
    "verdict",
    "completion_unobserved",
    "redundant",
    "n_published_brokers",
    "n_retried",
    "n_completed",
    "publish_to_start_ms",
    "start_to_complete_ms",
    "publish_to_complete_ms",
    "published_brokers",
    "delivered_brokers",
    "first_published_ms",
    "first_started_ms",
    "first_completed_ms",
    "started_broker",
    "completed_broker",
    "malformed_lines",
    "bad_line_min",
    "bad_line_max",
)
#: The step name of the one pass over the input (the progress display names it).
READ_STEP = "reading trace and grouping events by message"


@dataclass
class AuditResult:
    """What the caller needs: the summary written to ``summary.json`` and where things are."""

    summary: dict[str, Any]
    out_dir: str
    files: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """No valid event at all: the trace is missing, garbage, or the run sent nothing."""
        return not self.summary["messages"]

    @property
    def ok(self) -> bool:
        """False when any message is lost, duplicated or unexpected, or none was seen: a
        trace with no evidence (a wrong path, a garbled file) must not read as clean."""
        return not self.empty and not any(self.summary[v] for v in BAD_VERDICTS)


#: Below this much input, the local JVM runs its quick compiler only (see :func:`build_session`).
SMALL_INPUT_BYTES = 512 * 1024 * 1024


def local_input_bytes(paths: list[str]) -> int | None:
    """The size of local trace files (files, directories, globs), read before Spark starts;
    None when a path is a URL or matches nothing (the JVM's defaults are kept)."""
    import glob

    total = 0
    for path in paths:
        if "://" in path and not path.startswith("file://"):
            return None
        matches = glob.glob(path.removeprefix("file://"))
        if not matches:
            return None
        for match in matches:
            if os.path.isdir(match):
                for root, _dirs, files in os.walk(match):
                    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
            else:
                total += os.path.getsize(match)
    return total


def build_session(
    master: str | None = None,
    *,
    driver_memory: str = "2g",
    shuffle_partitions: int | None = None,
    app_name: str = "beetle-audit",
    input_bytes: int | None = None,
) -> SparkSession:
    """A session sized for one machine by default, or joined to ``master`` when given.

    Under ``spark-submit`` the master and memory come from the command line and win: the
    builder only fills in what is not already set. The driver heap matters in local mode,
    where the driver is the only executor. It caps the audit's memory whatever the input
    size (Spark spills to disk beyond it); 10 M events ran as fast with 1.5 GiB as with 3.

    ``input_bytes`` (:func:`local_input_bytes`): below :data:`SMALL_INPUT_BYTES` a local JVM
    compiles with C1 only (``-XX:TieredStopAtLevel=1``). A small audit is over before C2's
    optimised code pays for its compile time on two cores: Spark starts and reads a 40 MB
    trace about 3 s sooner. A large one keeps C2, whose code it runs long enough to need.

    A local JVM also maps Spark's classes from an archive (:mod:`.class_cache`), written by
    the first audit on the machine: a session starts about 3.5 s sooner. The caller hands
    the session to :func:`.class_cache.publish` when done, so that a first audit's archive is
    put in place.
    """
    builder = SparkSession.builder.appName(app_name)
    # spark-submit starts the JVM first and hands Python its gateway: then its --master and
    # --driver-memory are already in force and must not be overridden here.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master:
        builder = builder.master(master)
    elif not submitted:
        builder = builder.master("local[*]")
    local = (master or "local").startswith("local") and not submitted
    cores = os.cpu_count() or 2
    builder = (
        builder.config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions or max(8, 4 * cores)))
        .config(SHUFFLE_PARTITIONS_SET, "true" if shuffle_partitions else "")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.files.maxPartitionBytes", str(128 * 1024 * 1024))
    )
    if not submitted:
        builder = builder.config("spark.driver.memory", driver_memory)
    if local:
        # The throughput collector beats G1 for a short batch job on few cores; at least four
        # input splits per core keep both cores busy to the end on small traces too.
        java_options = f"-XX:+UseParallelGC {quiet.java_options()}"
        if input_bytes is not None and input_bytes < SMALL_INPUT_BYTES:
            java_options += " -XX:TieredStopAtLevel=1"
        if SparkContext._gateway is None:  # this call starts the JVM: Spark's classes mapped
            java_options += " " + class_cache.java_options()
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.driver.extraJavaOptions", java_options)
            .config("spark.sql.files.minPartitionNum", str(4 * cores))
        )
    starting = local and SparkContext._gateway is None
    if starting:
        quiet.local_environment()
    with quiet.filtered_stderr() if starting else contextlib.nullcontext():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


#: Input per partition of the cached per-message table: every figure after the grouping is a
#: query over that cache, and each of its partitions is a task per query. At 10 M events
#: (2.8 GB) the grouping's 84 partitions made the summary's five queries take 15 s; six
#: partitions of the same rows, 6 s. A partition stays a few tens of MB of cache.
CACHE_BYTES_PER_PARTITION = 512 * 1024 * 1024


def shuffle_partitions_for(spark: SparkSession, paths: list[str]) -> int:
    """Partitions of the one shuffle: one per 32 MiB of input, at least one per core.

    A 40 MB trace then groups in two tasks instead of sixteen half-empty ones (each with its
    own start-up and a cached block of its own), and 30 GB in ~900 tasks whose groups fit in
    memory. Adaptive execution does not coalesce a cached plan's partitions, so they are set
    here, from the input's size as Hadoop lists it (any file system, globs included).
    """
    return _partitions(spark, _input_bytes(spark, paths), SHUFFLE_BYTES_PER_PARTITION)


def _partitions(spark: SparkSession, input_bytes: int, per_partition: int) -> int:
    """One partition per ``per_partition`` bytes of input, at least one per core."""
    return max(spark.sparkContext.defaultParallelism, -(-input_bytes // per_partition))


def _input_bytes(spark: SparkSession, paths: list[str]) -> int:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    total = 0
    for path in paths:
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = hpath.getFileSystem(conf)
        for status in fs.globStatus(hpath) or []:
            total += fs.getContentSummary(status.getPath()).getLength()
    return int(total)


def _write(df: DataFrame, path: str, partition_by: str | None = None) -> None:
    writer = df.write.mode("overwrite")
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.parquet(path)


def run_audit(
    spark: SparkSession,
    trace_path: str | list[str],
    out_dir: str,
    *,
    skew_tolerance_ms: int = transforms.DEFAULT_SKEW_TOLERANCE_MS,
    samples_per_class: int = 5,
    tables: bool = False,
    step: Callable[[str], None] = lambda _msg: None,
) -> AuditResult:
    """Audit the trace at ``trace_path``; write the summary and report under ``out_dir``.

    ``tables`` adds the Parquet tables; they are written once, from the cached per-message
    table, after the verdict is known.
    """
    started = time.perf_counter()
    out = out_dir.rstrip("/")
    paths = [trace_path] if isinstance(trace_path, str) else list(trace_path)

    timings: dict[str, float] = {}
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        timings[name] = round(now - mark, 1)
        mark = now

    sc = spark.sparkContext

    def begin(name: str) -> None:
        sc.setJobDescription(name)
        step(name)

    # Python waits while the JVM works: import the report's plotting library meanwhile.
    threading.Thread(target=report.warm_up, name="audit-report-import", daemon=True).start()
    begin(READ_STEP)
    settings = {HASH_AGGREGATE_KEYS: str(HASH_AGGREGATE_MAX_KEYS)}
    input_bytes = _input_bytes(spark, paths)
    if not spark.conf.get(SHUFFLE_PARTITIONS_SET, None):
        shuffle = _partitions(spark, input_bytes, SHUFFLE_BYTES_PER_PARTITION)
        settings["spark.sql.shuffle.partitions"] = str(shuffle)
    restore = {k: str(spark.conf.get(k)) for k in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    # Numbers only (.numeric), unless the tables want every message's runs, or a negative
    # tolerance makes non-overlapping runs overlap (.numeric.per_message is exact from 0).
    sampled = None if tables or skew_tolerance_ms < 0 else names.sample(paths)
    events = transforms.mark_malformed(_read(spark, paths))
    if sampled is None:
        facts = transforms.per_message(events)
    else:
        facts = numeric.per_message(events, sampled)
    classified = transforms.classify(facts, skew_tolerance_ms)
    if not tables and sampled is None:  # the summary's columns only: the runs are large
        classified = classified.select(*SUMMARY_COLUMNS)
    elif not tables:  # ... and a message's brokers as numbers, not lists
        lists = ("published_brokers", "delivered_brokers")
        kept = [k for k in SUMMARY_COLUMNS if k not in lists]
        assert sampled is not None
        classified = classified.select(*kept, *numeric.broker_columns(sampled), "exact")
    brokers_named = sampled.brokers if sampled is not None else None
    # The one pass over the input fills this cache; every figure after it is a small query
    # over the per-message rows. Blocks that do not fit in memory go to local disk. Fewer,
    # larger partitions than the grouping's (merged without a shuffle) make those queries
    # cheaper: each partition is a task per query.
    cached = _partitions(spark, input_bytes, CACHE_BYTES_PER_PARTITION)
    classified = classified.coalesce(cached).persist(StorageLevel.MEMORY_AND_DISK)
    again: DataFrame | None = None
    try:
        messages, malformed_df = transforms.split_malformed(classified)
        totals = aggregates.totals(messages)
        if totals.get(aggregates.INEXACT):
            assert sampled is not None
            inexact = int(totals[aggregates.INEXACT])
            again = _judged_again(
                spark, paths, messages, sampled, inexact, skew_tolerance_ms, cached
            )
            messages, brokers_named = again, None
            totals = aggregates.totals(messages)
        lap("read_and_group")

        begin("summarising")
        malformed = malformed_df.first()
        counts = {k: totals[k] for k in SUMMARY_COUNTS if k in totals}
        counts["malformed_lines"] = int(malformed["malformed_lines"]) if malformed else 0
        bad_lines = (
            sorted({malformed["bad_line_min"], malformed["bad_line_max"]} - {None})
            if malformed
            else []
        )
        latency = aggregates.latency_percentiles(messages)
        span = (totals[aggregates.SPAN_KEYS[0]], totals[aggregates.SPAN_KEYS[1]])
        timeline, brokers = aggregates.timeline_and_brokers(
            messages, span=span, brokers=brokers_named
        )
        samples = aggregates.samples(messages, samples_per_class, counts=totals)
        samples["malformed_lines"] = [line[:300] for line in bad_lines]
        lap("summarise")

        files: dict[str, str] = {}
        if tables:
            begin("writing Parquet tables")
            tagged = classified.withColumn(
                "verdict",
                F.when(F.col("message_id").isNull(), F.lit(MALFORMED_PARTITION)).otherwise(
                    F.col("verdict")
                ),
            )
            files["messages"] = f"{out}/messages"
            _write(tagged, files["messages"], partition_by="verdict")
            files["latency"] = f"{out}/latency"
            _write(_small_table(spark, latency, LATENCY_TABLE), files["latency"])
            files["brokers"] = f"{out}/brokers"
            _write(_small_table(spark, brokers, BROKERS_TABLE), files["brokers"])
            lap("tables")
    finally:
        classified.unpersist()
        if again is not None:
            again.unpersist()
        sc.setJobDescription(None)  # type: ignore[arg-type]
        for key, value in restore.items():
            spark.conf.set(key, value)

    overall = next((r for r in latency if r["task_name"] == "*"), None)
    if overall is None:  # nothing completed: no overall row, every figure is None
        overall = {k: None for k in LATENCY_TABLE.fieldNames()} | {"task_name": "*", "queue": "*"}
        overall["completed"] = 0
    summary: dict[str, Any] = {k: counts.get(k, 0) for k in SUMMARY_COUNTS}
    summary.update(
        ok=bool(summary["messages"]) and not any(summary[v] for v in BAD_VERDICTS),
        latency_ms=_overall_latency(overall),
        latency_by_task=[r for r in latency if r["task_name"] != "*"],
        brokers=brokers,
        timeline=timeline,
        redundancy={k: totals[k] for k in aggregates.REDUNDANCY_KEYS},
        samples=samples,
        trace_path=paths,
        skew_tolerance_ms=skew_tolerance_ms,
        timings_s=timings,
        elapsed_s=round(time.perf_counter() - started, 1),
    )

    step("writing summary and report")
    files.update(summary=f"{out}/summary.json", report=f"{out}/report.html")
    _put_text(spark, files["summary"], json.dumps(summary, indent=2, default=str) + "\n")
    _put_text(spark, files["report"], report.render(summary))
    return AuditResult(summary=summary, out_dir=out, files=files)


def _read(spark: SparkSession, paths: list[str]) -> DataFrame:
    reader = spark.read.schema(transforms.READ_SCHEMA).options(**transforms.read_options())
    return reader.json(paths)


#: Messages judged again by a broadcast join at most: their keys go to every task.
BROADCAST_KEYS = 500_000


def _judged_again(
    spark: SparkSession,
    paths: list[str],
    messages: DataFrame,
    sampled: names.Names,
    count: int,
    skew_tolerance_ms: int,
    partitions: int,
) -> DataFrame:
    """The per-message table with its inexact messages judged again from their events, by
    the per-message lists (:func:`.transforms.per_message`); cached.

    Reads the input a second time, so it runs only when :func:`.numeric.per_message` left a
    message inexact (a name the sample missed, three runs, a run started three times): a
    trace without one is read once. The table it returns lists each message's brokers (the
    names the sample missed have no number).
    """
    inexact = messages.where(~F.col("exact")).select("queue", "message_id")
    if count <= BROADCAST_KEYS:  # else Spark joins by shuffling both sides
        inexact = F.broadcast(inexact)
    events = transforms.mark_malformed(_read(spark, paths)).where(~F.col("malformed"))
    theirs = events.join(inexact, ["queue", "message_id"], "left_semi")
    judged = transforms.classify(transforms.per_message(theirs), skew_tolerance_ms)
    judged = judged.select(*SUMMARY_COLUMNS, F.lit(True).alias("exact"))
    exact = numeric.with_broker_lists(messages.where(F.col("exact")), sampled)
    patched = exact.select(*SUMMARY_COLUMNS, "exact").unionByName(judged)
    return patched.coalesce(partitions).persist(StorageLevel.MEMORY_AND_DISK)


#: The Parquet schemas of the two small tables (rows computed in Python from aggregates).
LATENCY_TABLE = StructType(
    [
        StructField("task_name", StringType()),
        StructField("queue", StringType()),
        StructField("completed", LongType()),
        *[
            StructField(f"{col.removesuffix('_ms')}_p{p}_ms", LongType())
            for col in aggregates.LATENCY_COLUMNS
            for p in (50, 90, 99)
        ],
    ]
)
BROKERS_TABLE = StructType(
    [
        StructField("broker", StringType()),
        StructField("deliveries", LongType()),
        StructField("published_messages", LongType()),
    ]
)


def _small_table(spark: SparkSession, rows: list[dict[str, Any]], schema: StructType) -> DataFrame:
    names = schema.fieldNames()
    return spark.createDataFrame([tuple(r.get(k) for k in names) for r in rows], schema).coalesce(1)


def _overall_latency(row: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{"publish_to_start": {"p50": …, "p90": …, "p99": …}, …}`` from the overall row."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in (row or {}).items():
        if key.endswith("_ms") and "_p" in key:
            span, pct = key.removesuffix("_ms").rsplit("_", 1)
            out.setdefault(span, {})[pct] = value
    return out


def _put_text(spark: SparkSession, path: str, text: str) -> None:
    """Write a small text file locally, or through Hadoop's FileSystem for remote outputs."""
    if "://" not in path or path.startswith("file://"):
        local = path.removeprefix("file://")
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        with open(local, "w", encoding="utf-8") as f:
            f.write(text)
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.create(hpath, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``spark-submit job.py TRACE_PATH OUT_DIR``; exit 1 on a bad verdict."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: spark-submit job.py TRACE_PATH OUT_DIR", file=sys.stderr)
        return 2
    spark = build_session(input_bytes=local_input_bytes([args[0]]))
    result = run_audit(spark, args[0], args[1], step=lambda m: print(m, file=sys.stderr))
    class_cache.publish(spark)
    print(json.dumps({k: result.summary[k] for k in SUMMARY_COUNTS}))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
