"""The audit JVM's class archive: written once, put in place only when whole, then mapped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from celery_beetle.audit import class_cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv(class_cache.CACHE_ENV, str(directory))
    monkeypatch.setattr(class_cache, "_dumping", None)
    return directory


def test_switched_off_the_jvm_gets_no_archive_options(monkeypatch):
    monkeypatch.setenv(class_cache.CACHE_ENV, "off")
    assert class_cache.archive_path() is None
    assert class_cache.java_options() == ""


def test_without_an_archive_the_first_audit_writes_one_to_a_temporary_file(cache_dir):
    options = class_cache.java_options()
    dumping = cache_dir / f"{class_cache.archive_path().name}.{os.getpid()}.tmp"
    assert f"-XX:ArchiveClassesAtExit={dumping}" in options
    assert "SharedArchiveFile" not in options  # nothing half-written is ever mapped
    assert dumping.exists()


def test_while_one_audit_writes_the_archive_another_neither_writes_nor_maps_it(
    cache_dir, monkeypatch
):
    class_cache.java_options()
    monkeypatch.setattr(class_cache, "_dumping", None)  # as another process would start
    assert class_cache.java_options() == ""


def test_a_temporary_archive_left_by_a_killed_audit_is_deleted_and_written_afresh(cache_dir):
    path = class_cache.archive_path()
    cache_dir.mkdir()
    stale = cache_dir / f"{path.name}.99999.tmp"
    stale.write_bytes(b"truncated")  # a JVM that maps a truncated archive dies of SIGBUS
    old = time.time() - class_cache.DUMP_IN_PROGRESS_S - 60
    os.utime(stale, (old, old))
    options = class_cache.java_options()
    assert not stale.exists()
    assert "ArchiveClassesAtExit" in options and "SharedArchiveFile" not in options


def test_an_archive_in_place_is_mapped_and_marked_as_used(cache_dir):
    path = class_cache.archive_path()
    cache_dir.mkdir()
    path.write_bytes(b"archive")
    os.utime(path, (1, 1))
    assert class_cache.java_options().startswith(f"-XX:SharedArchiveFile={path} ")
    assert path.stat().st_mtime > 1
    assert class_cache.java_options(write=False).startswith("-XX:SharedArchiveFile=")


def test_only_the_three_most_recently_used_archives_are_kept(cache_dir):
    cache_dir.mkdir()
    for age in range(5):
        archive = cache_dir / f"spark-0-{age}.jsa"
        archive.write_bytes(b"x")
        os.utime(archive, (1000 - age, 1000 - age))
    class_cache._clear_old(cache_dir)
    assert sorted(p.name for p in cache_dir.iterdir()) == [
        "spark-0-0.jsa",
        "spark-0-1.jsa",
        "spark-0-2.jsa",
    ]


@pytest.mark.spark
def test_a_built_archive_is_put_in_place_whole_and_the_next_audit_maps_it(tmp_path):
    env = {**os.environ, class_cache.CACHE_ENV: str(tmp_path / "cache")}
    build = [sys.executable, "-m", "celery_beetle.audit.warm"]
    subprocess.run(build, env=env, check=True, capture_output=True, timeout=300)
    archives = list((tmp_path / "cache").iterdir())
    assert [p.suffix for p in archives] == [".jsa"]  # in place, no temporary file left
    trace = tmp_path / "trace.jsonl"
    from celery_beetle.audit import warm  # imports pyspark

    trace.write_text("\n".join(warm._LINES) + "\n")
    audit = [sys.executable, "-m", "celery_beetle.cli", "audit", str(trace), "--quiet"]
    audit += ["--out", str(tmp_path / "out")]
    run = subprocess.run(audit, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["completed_once"] == 50
    assert "[cds]" not in run.stdout + run.stderr
