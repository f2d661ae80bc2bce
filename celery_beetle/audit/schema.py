"""The shape of a trace line and of the audit's verdict.

One explicit schema, never inference: inference reads the input twice and would type a field
by whatever the first lines happen to hold, so one bad writer could change the meaning of
every other line. Lines that do not fit the schema are counted as malformed, not guessed at.

``detail`` is read as ``map<string,string>``: it is free-form per event (``confirmed`` on
``published``, ``exc`` on ``failed``, ``reason`` on ``dead_lettered``), and a map keeps a line
valid whatever keys a newer writer adds; nested values arrive as their JSON text.
"""

from __future__ import annotations

from pyspark.sql.types import (
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from celery_beetle.audit.verdicts import (
    BAD_VERDICTS,
    REQUIRED_FIELDS,
    SUMMARY_COUNTS,
    VERDICTS,
)
from kombu_beetle.trace import EVENTS, FIELDS

__all__ = [
    "BAD_VERDICTS",
    "CORRUPT_COLUMN",
    "EVENTS",
    "EVENT_SCHEMA",
    "FIELDS",
    "REQUIRED_FIELDS",
    "SUMMARY_COUNTS",
    "VERDICTS",
]

#: Name of the column that holds the raw text of a line that did not parse.
CORRUPT_COLUMN = "_corrupt_record"

EVENT_SCHEMA = StructType(
    [
        StructField("ts_ms", LongType()),
        StructField("event", StringType()),
        StructField("message_id", StringType()),
        StructField("queue", StringType()),
        StructField("task_name", StringType()),
        StructField("task_id", StringType()),
        StructField("broker", StringType()),
        StructField("worker", StringType()),
        StructField("pid", LongType()),
        StructField("attempt", IntegerType()),
        StructField("detail", MapType(StringType(), StringType())),
    ]
)
assert tuple(f.name for f in EVENT_SCHEMA.fields) == FIELDS
