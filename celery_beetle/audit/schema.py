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

#: A line missing any of these is malformed: without them it cannot be placed or ordered.
REQUIRED_FIELDS = ("ts_ms", "event", "message_id", "queue")

#: Every message gets exactly one verdict, checked in this order (the first that holds wins):
#: a completion nobody published is ``unexpected`` even if it also ran twice.
VERDICTS = (
    "unexpected",  # completed, but neither ``published`` nor ``enqueued`` for it
    "duplicated",  # completed more than once, or two runs overlapping in time
    "replayed",  # dead-lettered, replayed (``beetle dead-letters replay``), then completed once
    "completed_once",
    "dead_lettered",  # gave up after its retries; accounted for, not lost
    "expired",  # dropped unrun because its x-beetle-expires-at passed
    "failed",  # failed for good without a dead-letter queue (more failures than retries)
    "set_aside",  # committed to the outbox, set aside by the relay with a reason
    "never_relayed",  # committed to the outbox (``enqueued``), never published
    "lost",  # published and confirmed, and none of the outcomes above
    "unconfirmed",  # published, never confirmed, no outcome: the publisher saw an error
    "untracked",  # events from consumers only, with no publish and no outcome
)

#: The verdicts that make ``beetle audit`` exit non-zero.
BAD_VERDICTS = ("lost", "duplicated", "unexpected", "never_relayed")

#: The counts ``summary.json`` always holds, in this order.
SUMMARY_COUNTS = (
    "messages",
    "completed_once",
    "lost",
    "duplicated",
    "unexpected",
    "replayed",
    "dead_lettered",
    "expired",
    "failed",
    "unconfirmed",
    "untracked",
    "never_relayed",
    "set_aside",
    "completed_unobserved",  # completed_once on the store's word: the event itself is missing
    "retried_messages",
    "retries",
    "malformed_lines",
)
