"""The trace writer: format, buffering, rolling, per-process files, and never failing a task."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from kombu_beetle import trace
from kombu_beetle.trace import EVENTS, FIELDS, NullTracer, TraceWriter, get_tracer


class FakeClock:
    def __init__(self, now: float = 1_763_769_600.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _lines(directory: Path) -> list[dict]:
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def _writer(tmp_path: Path, **kw) -> TraceWriter:
    kw.setdefault("clock", FakeClock())
    kw.setdefault("flush_interval_s", 3600)
    return TraceWriter(tmp_path, host="h1", **kw)


def test_event_line_has_every_field_in_order_with_nulls_for_absent_ones(tmp_path):
    w = _writer(tmp_path, worker="celery@h1")
    w.emit("started", "m1", "orders", task_name="t.add", attempt=1, broker="a:5672")
    w.flush()
    (rec,) = _lines(tmp_path)
    assert tuple(rec) == FIELDS
    assert rec["ts_ms"] == 1_763_769_600_000
    assert rec["event"] == "started" and rec["queue"] == "orders" and rec["attempt"] == 1
    assert rec["pid"] == os.getpid() and rec["worker"] == "celery@h1"
    assert rec["task_id"] is None and rec["detail"] is None


def test_published_detail_is_kept_as_an_object(tmp_path):
    w = _writer(tmp_path, role="publisher")
    for broker in ("a:5672", "b:5672"):
        detail = {"confirmed": True, "redundant": True, "copies": 2}
        w.emit("published", "m1", "orders", broker=broker, detail=detail)
    w.close()
    recs = _lines(tmp_path)
    assert [r["broker"] for r in recs] == ["a:5672", "b:5672"]
    assert recs[0]["detail"] == {"confirmed": True, "redundant": True, "copies": 2}


def test_events_stay_in_memory_until_flushed(tmp_path):
    w = _writer(tmp_path)
    w.emit("delivered", "m1", "q")
    assert _lines(tmp_path) == []
    w.flush()
    assert len(_lines(tmp_path)) == 1


def test_outcome_events_are_written_through_so_kill_minus_9_keeps_them(tmp_path):
    w = _writer(tmp_path)
    w.emit("started", "m1", "q", attempt=1)
    w.emit("completed", "m1", "q", attempt=1)
    assert [r["event"] for r in _lines(tmp_path)] == ["started", "completed"]


def test_deferred_outcome_events_wait_for_the_callers_flush_owed(tmp_path):
    w = _writer(tmp_path, defer_sync=True)
    w.emit("delivered", "m1", "q")
    w.flush_owed()  # nothing settled yet: no write
    assert _lines(tmp_path) == []
    w.emit("completed", "m1", "q", attempt=1)
    assert _lines(tmp_path) == []
    w.flush_owed()
    assert [r["event"] for r in _lines(tmp_path)] == ["delivered", "completed"]
    w.emit("duplicate", "m1", "q")
    w.flush_owed()  # owed nothing since the last write
    assert len(_lines(tmp_path)) == 2


@pytest.mark.parametrize(
    "value",
    [
        None,
        0,
        -12,
        2**70,
        True,
        False,
        1.5,
        float("nan"),
        "plain",
        'quote " and \\ backslash',
        "control \n\t\x00 and unicode é \u2603 \U0001f600",
        {"redelivered": False, "n": 3, "text": "é"},
        {"nested": {"a": [1, "b", None]}, "f": 0.25},
        {1: "non-string key"},
        ["a", 1],
        object(),
        b"bytes",
    ],
)
def test_lines_are_written_exactly_as_json_dumps_writes_them(tmp_path, value):
    """The writer fills a template instead of calling json.dumps per event; the text must
    not differ in any way a reader could notice."""
    w = _writer(tmp_path, worker="celery@h1")
    fields = dict(task_name=value, task_id=value, broker=value, attempt=value, detail=value)
    w.emit("started", "m1", "q", **fields)
    w.flush()
    (path,) = tmp_path.glob("*.jsonl")
    record = {"ts_ms": 1_763_769_600_000, "event": "started", "message_id": "m1", "queue": "q"}
    record.update(fields, worker="celery@h1", pid=os.getpid())
    record = {name: record[name] for name in FIELDS}
    assert path.read_text() == json.dumps(record, separators=(",", ":"), default=str) + "\n"


def test_full_buffer_wakes_the_flusher_thread(tmp_path):
    w = _writer(tmp_path, buffer_bytes=1, flush_interval_s=30)
    w.emit("delivered", "m1", "q")
    deadline = time.monotonic() + 5
    while not _lines(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_lines(tmp_path)) == 1
    w.close()


def test_idle_buffer_is_written_by_the_flusher_within_the_interval(tmp_path):
    w = _writer(tmp_path, flush_interval_s=0.05)
    w.emit("delivered", "m1", "q")
    deadline = time.monotonic() + 5
    while not _lines(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_lines(tmp_path)) == 1
    w.close()


def test_file_is_named_by_host_pid_role_start_and_sequence(tmp_path):
    w = _writer(tmp_path, role="publisher")
    w.emit("published", "m1", "q")
    w.flush()
    (path,) = tmp_path.glob("*.jsonl")
    assert path.name == f"h1-{os.getpid()}-publisher-20251122T000000Z-000.jsonl"


def test_file_rolls_by_size(tmp_path):
    w = _writer(tmp_path, max_bytes=1)
    for i in range(3):
        w.emit("delivered", f"m{i}", "q")
        w.flush()
    names = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    assert [n[-9:] for n in names] == ["000.jsonl", "001.jsonl", "002.jsonl"]
    assert len(_lines(tmp_path)) == 3


def test_file_rolls_by_age(tmp_path):
    clock = FakeClock()
    w = _writer(tmp_path, clock=clock, max_age_s=60)
    w.emit("delivered", "m1", "q")
    w.flush()
    clock.now += 61
    w.emit("delivered", "m2", "q")
    w.flush()
    assert len(list(tmp_path.glob("*.jsonl"))) == 2


def test_unwritable_directory_is_counted_and_logged_once_never_raised(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    w = _writer(blocker / "sub")
    for i in range(3):
        w.emit("delivered", f"m{i}", "q")
        w.flush()
    w.emit("completed", "m9", "q")  # write-through path too
    assert w.errors == 4 and w.dropped == 4 and w.written == 0
    assert len([r for r in caplog.records if "beetle trace" in r.getMessage()]) == 1


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root ignores modes")
def test_permission_denied_is_not_raised(tmp_path):
    tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        w = _writer(tmp_path / "t")
        w.emit("completed", "m1", "q")
        assert w.errors == 1
    finally:
        tmp_path.chmod(stat.S_IRWXU)


def test_buffer_limit_drops_new_events_instead_of_growing(tmp_path):
    w = _writer(tmp_path, max_buffer_bytes=400)
    for i in range(10):
        w.emit("delivered", f"m{i}", "q")
    assert 0 < w.dropped < 10
    w.flush()
    assert len(_lines(tmp_path)) == 10 - w.dropped


def test_unknown_event_is_counted_not_raised(tmp_path):
    w = _writer(tmp_path)
    w.emit("exploded", "m1", "q")
    w.flush()
    assert w.errors == 1 and _lines(tmp_path) == []


def test_unserialisable_detail_is_rendered_as_text(tmp_path):
    w = _writer(tmp_path)
    w.emit("failed", "m1", "q", detail={"exc": ValueError("boom")})
    w.flush()
    assert _lines(tmp_path)[0]["detail"] == {"exc": "boom"}


def test_closed_writer_ignores_emits(tmp_path):
    w = _writer(tmp_path)
    w.close()
    w.emit("delivered", "m1", "q")
    w.flush()
    assert _lines(tmp_path) == []


def test_get_tracer_is_off_without_a_target():
    assert isinstance(get_tracer(None), NullTracer)
    assert isinstance(get_tracer(""), NullTracer)
    NullTracer().emit("completed", "m1", "q")


def test_get_tracer_caches_one_writer_per_target_and_role(tmp_path):
    a = get_tracer(tmp_path, role="worker")
    assert get_tracer(str(tmp_path), role="worker") is a
    assert get_tracer(f"file://{tmp_path}", role="worker") is a
    assert get_tracer(tmp_path, role="publisher") is not a
    a.close()
    assert get_tracer(tmp_path, role="worker") is not a


def test_get_tracer_rejects_remote_urls_with_a_hint():
    with pytest.raises(ValueError, match="file:// URL"):
        get_tracer("s3a://bucket/traces")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_writes_its_own_file_and_not_the_parents_buffer(tmp_path):
    parent = get_tracer(tmp_path / "t", role="worker", flush_interval_s=3600)
    parent.emit("delivered", "parent-1", "q")
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            child = get_tracer(tmp_path / "t", role="worker", flush_interval_s=3600)
            code |= 1 if child is parent else 0
            child.emit("started", "child-1", "q")
            parent.emit("started", "child-2", "q")  # an inherited handle works too
            trace.flush_all()
        except BaseException:
            code |= 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    parent.flush()
    by_file = {
        p.name: [json.loads(x)["message_id"] for x in p.read_text().splitlines()]
        for p in (tmp_path / "t").glob("*.jsonl")
    }
    assert len(by_file) == 2
    mine = next(v for k, v in by_file.items() if f"-{os.getpid()}-" in k)
    theirs = next(v for k, v in by_file.items() if f"-{pid}-" in k)
    assert mine == ["parent-1"]
    assert sorted(theirs) == ["child-1", "child-2"]
    parent.close()


def test_every_documented_event_is_accepted(tmp_path):
    w = _writer(tmp_path)
    for event in EVENTS:
        w.emit(event, "m1", "q")
    w.flush()
    assert [r["event"] for r in _lines(tmp_path)] == list(EVENTS)


def test_trace_files_are_private_whatever_the_umask(tmp_path):
    old_umask = os.umask(0o000)
    try:
        w = _writer(tmp_path / "traces" / "deep")
        w.emit("completed", "m1", "q")
        w.close()
    finally:
        os.umask(old_umask)
    (path,) = (tmp_path / "traces" / "deep").glob("*.jsonl")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "traces" / "deep").stat().st_mode) == 0o700


def test_a_symlink_planted_at_the_trace_file_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    w = _writer(tmp_path / "traces")
    (tmp_path / "traces").mkdir()
    w.path.symlink_to(victim)
    w.emit("completed", "m1", "q")
    w.close()
    assert victim.read_text() == "precious\n"
    assert w.errors >= 1


def test_a_task_that_published_has_its_published_events_written_as_it_ends(tmp_path):
    """``task_postrun`` in a worker (celery_beetle.worker.run): before the sending task's delivery
    is acked, so a killed worker cannot leave a message that runs with no ``published``."""
    from celery.signals import task_postrun

    import celery_beetle.worker.run  # noqa: F401  (connects the handler)

    publisher = _writer(tmp_path / "p", role="publisher")
    worker = _writer(tmp_path / "w", role="worker")
    publisher.emit("published", "next-link", "orders", broker="a:5672")
    worker.emit("started", "m1", "orders")

    task_postrun.send(sender=None, task_id="m1", task=None)

    assert [r["message_id"] for r in _lines(tmp_path / "p")] == ["next-link"]
    assert _lines(tmp_path / "w") == []  # other roles keep their batching
    publisher.close()
    worker.close()
