"""A worker of the previous release: the product as it was at an earlier commit.

A rolling deploy runs workers of two releases side by side on one queue and one dedup
store, then replaces the old ones. The project has no release tags, so "the previous
release" is a commit: ``BEETLE_EXPLORE_PREVIOUS`` (``scripts/explore --previous REF``),
``HEAD~20`` by default, never older than :data:`FLOOR`. Its ``celery_beetle`` and
``kombu_beetle`` are extracted once per batch (``git archive``, no worktree of the
repository's own) under the batch's directory, with the current explorer's task module
laid over them (the tasks are the harness, not the release); a worker slot then runs with
that directory first on ``PYTHONPATH``. When the commit cannot be read or its code cannot
load the tasks, the scenario runs every slot on the current code and says why in its notes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["DEFAULT_REF", "ENV", "FLOOR", "checkout", "commit_of"]

DEFAULT_REF = "HEAD~20"
#: the oldest commit the default previous release may be. Older code loses messages by a
#: defect fixed since, not by the rolling deploy: with ``acks_late`` off its pool dropped a
#: copy it could not claim after Celery's early ack, so a twin the gate released as the
#: first copy was acked went, and the message with it when that run was cut short.
#: A ``REF`` given by name is taken as it is.
FLOOR = "844aede8a9ac6c80d6d0e85229372e5c7720fc93"
ENV = "BEETLE_EXPLORE_PREVIOUS"
ROOT = Path(__file__).resolve().parents[3]
#: the packages a release is made of
PACKAGES = ("celery_beetle", "kombu_beetle")


def checkout(base: Path, ref: str | None = None) -> tuple[Path | None, str]:
    """The previous release under ``base`` and a line saying which commit it is; ``None``
    and the reason when it cannot be had."""
    given = ref or os.environ.get(ENV)
    try:
        ref, sha = commit_of(given)
    except (OSError, subprocess.SubprocessError) as exc:
        ref = given or DEFAULT_REF
        return None, f"previous release {ref!r} skipped: not a commit here ({_why(exc)})"
    target = base / f"previous-{sha[:10]}"
    if not (target / "celery_beetle").is_dir():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        try:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", sha, *PACKAGES],
                capture_output=True, check=True, timeout=60,
            )  # fmt: skip
            subprocess.run(
                ["tar", "-x", "-C", str(target)], input=archive.stdout, check=True, timeout=60
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return (
                None,
                f"previous release {ref} ({sha[:10]}) skipped: checkout failed ({_why(exc)})",
            )
        harness = Path(__file__).resolve().parent
        shutil.copytree(harness, target / "celery_beetle/testing/explorer", dirs_exist_ok=True)
    probe = subprocess.run(
        [sys.executable, "-c", "import celery_beetle.testing.explorer.app"],
        cwd=target, env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"previous release {ref} ({sha[:10]}) skipped: its code does not load ({last})"
    return target, f"previous release {ref} ({sha[:10]})"


def commit_of(ref: str | None) -> tuple[str, str]:
    """The previous release's name and commit: ``ref``, or by default ``HEAD~20`` raised to
    :data:`FLOOR` when older (a history without the floor keeps ``HEAD~20``)."""
    if ref:
        return ref, _commit(ref)
    sha = _commit(DEFAULT_REF)
    try:
        floor = _commit(FLOOR)
        older = sha != floor and _is_ancestor(sha, floor)
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_REF, sha
    return (FLOOR[:7], floor) if older else (DEFAULT_REF, sha)


def _commit(ref: str) -> str:
    return _git("rev-parse", "--verify", f"{ref}^{{commit}}").strip()


def _is_ancestor(older: str, newer: str) -> bool:
    found = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", older, newer],
        capture_output=True, timeout=30,
    )  # fmt: skip
    return found.returncode == 0


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def _why(exc: BaseException) -> str:
    stderr = getattr(exc, "stderr", None)
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    return (stderr or str(exc)).strip().splitlines()[-1] if (stderr or str(exc)).strip() else "?"
