"""The trace's broker and task names, sampled from the files before Spark reads them.

The per-message grouping runs in Spark's compiled hash aggregation only when every buffer is
a number (:mod:`.numeric`): a broker or a task name must cross it as its place in a small
dictionary. A trace holds a handful of brokers and a few dozen tasks, and every file names
most of them within its first lines, so the head and the tail of each local file (a few
hundred KB in all, read while the JVM starts) find them. A name the sample missed is not
guessed at: its messages are judged again from their events with the per-message lists
(:func:`.numeric.per_message` marks them inexact), so a poor sample costs time, never a verdict.

Remote inputs (``s3a:``, ``hdfs:``) and traces with more names than the dictionaries hold
get no sample, and the audit groups with lists as before.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from dataclasses import dataclass

__all__ = ["MAX_BROKERS", "MAX_TASKS", "Names", "sample"]

#: Brokers a sample may name: each is a bit of a mask and a delivery counter per message.
MAX_BROKERS = 16
#: Tasks a sample may name: each row looks its task up in this list.
MAX_TASKS = 64
#: Bytes read from the start and from the end of each file.
SAMPLE_BYTES = 64 * 1024
#: Files sampled at most (spread over the sorted list): names are few, files may be many.
MAX_FILES = 256


@dataclass(frozen=True)
class Names:
    """Sorted broker and task names: a name's code is its place in the tuple, from 1."""

    brokers: tuple[str, ...]
    tasks: tuple[str, ...]


def _files(paths: list[str]) -> list[str] | None:
    """Local files as Spark's reader lists them (hidden and ``_`` files skipped), or None."""
    found: list[str] = []
    for path in paths:
        if "://" in path and not path.startswith("file://"):
            return None
        for match in sorted(glob.glob(path.removeprefix("file://"))):
            if os.path.isdir(match):
                for root, dirs, files in os.walk(match):
                    dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                    found += [
                        os.path.join(root, f) for f in sorted(files) if not f.startswith((".", "_"))
                    ]
            elif not os.path.basename(match).startswith((".", "_")):
                found.append(match)
    return found


def _chunks(path: str) -> list[bytes]:
    """The head of the file, and its tail when it is not compressed."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return [f.read(SAMPLE_BYTES)]
    with open(path, "rb") as f:
        head = f.read(SAMPLE_BYTES)
        size = os.fstat(f.fileno()).st_size
        if size <= 2 * SAMPLE_BYTES:
            return [head + f.read()]
        f.seek(size - SAMPLE_BYTES)
        return [head, f.read()]


def sample(paths: list[str]) -> Names | None:
    """The names in the heads and tails of the trace's local files; None when the input is
    not local or holds more names than :data:`MAX_BROKERS`/:data:`MAX_TASKS`."""
    files = _files(paths)
    if files is None:
        return None
    if len(files) > MAX_FILES:
        step = len(files) / MAX_FILES
        files = [files[int(i * step)] for i in range(MAX_FILES)]
    brokers: set[str] = set()
    tasks: set[str] = set()
    for path in files:
        try:
            chunks = _chunks(path)
        except OSError:
            continue
        for chunk in chunks:
            for line in chunk.split(b"\n"):
                try:
                    rec = json.loads(line)
                except ValueError:  # a cut line at either end, or a malformed one
                    continue
                if not isinstance(rec, dict):
                    continue
                if isinstance(rec.get("broker"), str):
                    brokers.add(rec["broker"])
                if isinstance(rec.get("task_name"), str):
                    tasks.add(rec["task_name"])
    if len(brokers) > MAX_BROKERS or len(tasks) > MAX_TASKS:
        return None
    return Names(tuple(sorted(brokers)), tuple(sorted(tasks)))
