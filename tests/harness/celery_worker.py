"""Moved to :mod:`celery_beetle.testing.worker`; this path stays for old imports.

Here the default ``root`` (where the worker runs and what it imports from) is this repository,
as it was: tests and benchmarks run ``tests.exactly_once.app`` from any working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery_beetle.testing import worker as _worker

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "WorkerProcess"]


class WorkerProcess(_worker.WorkerProcess):
    """:class:`celery_beetle.testing.worker.WorkerProcess` rooted at this repository."""

    def __init__(self, *args: Any, root: Path = ROOT, **kwargs: Any) -> None:
        super().__init__(*args, root=root, **kwargs)
