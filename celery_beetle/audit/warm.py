"""Write this machine's class-data archive ahead of the first audit, with a tiny audit.

``python -m celery_beetle.audit.warm`` (``scripts/setup-env`` runs it): the first real audit
then maps Spark's classes instead of writing the archive (:mod:`.class_cache`, about 20 s
once). Apart from the archive's own module, because it runs an audit: the audit's job
(:mod:`.job`) uses the archive, and this uses the job.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from celery_beetle.audit import class_cache, job

__all__ = ["build"]

#: A tiny trace for :func:`build`: a message published, run and completed.
_LINES = [
    json.dumps(
        {"ts_ms": 1000 * i + k, "event": event, "message_id": f"m{i}", "queue": "q", "broker": "b"}
    )
    for i in range(50)
    for k, event in enumerate(("published", "delivered", "started", "completed"))
]


def build() -> Path | None:
    """Write this machine's archive now, with a tiny audit, unless it is there already.
    Returns its path (None when the cache is off or could not be written)."""
    path = class_cache.archive_path()
    if path is None or path.is_file():
        return path
    with tempfile.TemporaryDirectory(prefix="beetle-class-cache-") as scratch:
        trace = Path(scratch) / "trace.jsonl"
        trace.write_text("\n".join(_LINES) + "\n", encoding="utf-8")
        spark = job.build_session(input_bytes=trace.stat().st_size)
        job.run_audit(spark, str(trace), str(Path(scratch) / "out"))
        class_cache.publish(spark)
    return path if path.is_file() else None


if __name__ == "__main__":
    built = build()
    print(f"beetle audit class archive: {built or 'off (not written)'}", file=sys.stderr)
