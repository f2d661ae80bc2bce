"""The floor under ``beetle audit``: start Spark the way the audit does and read the input once.

No audit can finish faster than this on the same machine at the same moment, so
:mod:`benchmarks.bench_audit` measures it beside every audit run and reports the audit's time
beyond it. The read parses every line with the audit's schema (a bare ``count()`` would let
Spark skip the parsing) and prints ``{"lines": n, "session_s": …}`` as the last line.

Two floors, by what the read aggregates (Spark's JSON reader converts only the fields a query
names, so this decides how much of each line it parses):

``--fields two`` (the default, the floor measured since the audit's first benchmark)
    ``message_id`` and ``ts_ms`` only: the reader skips converting the other fields, so this
    is lower than any read the audit itself could make.
``--fields audit``
    every field the audit reads (:data:`celery_beetle.audit.transforms.LINE_FIELDS`, that is
    all but ``task_id``, and the corrupt-record column): the one read the audit cannot avoid.
``--fields group``
    that read, then the least grouping any per-message audit needs: a message's events come
    from different processes' files, so each event (its key, time and one number standing for
    its other fields) crosses a shuffle and is counted per message, by Spark's own plan. The
    audit's time beyond this floor is its own work (the facts it keeps per message, the
    verdicts, the summary); the time between this floor and ``audit`` is the shuffle and one
    compiled aggregation, which a cluster spreads over its executors and two cores cannot.

Usage: ``python -m benchmarks.audit_floor TRACE_PATH... [--fields two|audit|group]
[--driver-memory 2g]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace_path", nargs="+")
    p.add_argument("--fields", choices=("two", "audit", "group"), default="two")
    p.add_argument("--driver-memory", default="2g")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    from pyspark.sql import functions as F

    from celery_beetle.audit import job, transforms
    from celery_beetle.audit.schema import CORRUPT_COLUMN

    input_bytes = job.local_input_bytes(a.trace_path)
    spark = job.build_session(driver_memory=a.driver_memory, input_bytes=input_bytes)
    session_s = time.perf_counter() - t0
    raw = spark.read.schema(transforms.READ_SCHEMA).options(**transforms.read_options())
    aggs = [F.count("message_id").alias("n"), F.max("ts_ms")]
    if a.fields == "audit":  # a count of each: the reader must convert every one of them
        read = [*transforms.LINE_FIELDS, CORRUPT_COLUMN]
        aggs += [F.count(c) for c in read if c not in ("message_id", "ts_ms")]
    events = raw.json(a.trace_path)
    if a.fields == "group":  # as many shuffle partitions as the audit's
        partitions = job.shuffle_partitions_for(spark, a.trace_path)
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        row = _grouped(events).first()
    else:
        row = events.agg(*aggs).first()
    assert row is not None
    out = {"lines": row["n"], "session_s": round(session_s, 1), "fields": a.fields}
    if a.fields == "group":
        out["messages"] = row["messages"]
    print(json.dumps(out))
    return 0


def _grouped(events: Any) -> Any:
    """Events shuffled by message and counted per message; one row: lines and messages."""
    from pyspark.sql import functions as F

    from celery_beetle.audit import transforms
    from celery_beetle.audit.schema import CORRUPT_COLUMN

    key = ("queue", "message_id")
    # every other field the audit reads folded into one number, so the reader converts each
    # (a map cannot be hashed: its size stands for it)
    rest = [c for c in (*transforms.LINE_FIELDS, CORRUPT_COLUMN) if c not in (*key, "ts_ms")]
    folded = F.xxhash64(*[F.size(c) if c == "detail" else F.col(c) for c in rest])
    per_message = events.groupBy(*key).agg(
        F.count(F.lit(1)).alias("n"), F.min("ts_ms").alias("first"), F.bit_xor(folded).alias("h")
    )
    return per_message.agg(
        F.sum("n").alias("n"), F.count(F.lit(1)).alias("messages"), F.max("first"), F.bit_xor("h")
    )


if __name__ == "__main__":
    sys.exit(main())
