"""The verdict's names, without Spark: what both audits (Spark and naive) classify into.

Kept apart from :mod:`.schema` (which builds Spark types) so that the small-trace checker
(:mod:`.naive`) and the pytest plugin can judge a trace on a machine without pyspark.
"""

from __future__ import annotations

__all__ = ["BAD_VERDICTS", "REQUIRED_FIELDS", "SUMMARY_COUNTS", "VERDICTS"]

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
