"""The audit's classification, on hand-written traces with one message per situation.

All the single-message situations share one trace and one Spark run (a module fixture): each
message id names its situation, and each test asserts on its own message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.audit.conftest import TraceBuilder

pytestmark = pytest.mark.spark

A, B = "a:5672", "b:5672"


def _audit(
    spark: Any, directory: Path, trace: TraceBuilder
) -> tuple[dict[tuple[str, str], Any], Any, int]:
    """Classified rows keyed by (queue, message id), the classified DataFrame, malformed count."""
    from celery_beetle.audit import transforms as T

    trace.write(directory)
    raw = spark.read.schema(T.READ_SCHEMA).options(**T.read_options()).json(str(directory))
    messages, malformed = T.split_malformed(T.per_message(T.mark_malformed(raw)))
    classified = T.classify(messages).cache()
    rows = {(r["queue"], r["message_id"]): r.asDict() for r in classified.collect()}
    m = malformed.first()
    return rows, classified, (m["malformed_lines"] if m else 0)


def _situations() -> TraceBuilder:
    t = TraceBuilder()
    t.published("once", 10.0).run("once", 10.5, 11.0)

    t.published("lost-started", 10.0).ev("delivered", "lost-started", 10.1)
    t.ev("started", "lost-started", 10.2, attempt=1)
    t.published("lost-undelivered", 10.0, brokers=(A, B))
    t.published("unconfirmed", 10.0, confirmed=False)

    t.published("twice", 10.0).run("twice", 11, 12).run("twice", 20, 21, worker="w2", pid=2)

    t.published("overlap", 10.0, brokers=(A, B)).run("overlap", 11, 15, attempt=1)
    t.run("overlap", 12, 14, outcome="failed", attempt=2, worker="w2", pid=2, broker=B)

    t.published("retried", 10.0).run("retried", 11, 12, outcome="failed", attempt=1)
    t.ev("retried", "retried", 12.001, attempt=1).run("retried", 14, 15, attempt=2, worker="w2")

    # w2's clock runs 0.5 s behind: its run seems to start before w1's ended.
    t.published("skewed-retry", 10.0).run("skewed-retry", 11, 12, outcome="failed", attempt=1)
    t.ev("retried", "skewed-retry", 12.0, attempt=1)
    t.run("skewed-retry", 11.6, 13, attempt=2, worker="w2", pid=2)

    # The first worker was killed mid-run; its lease ran out and another worker finished.
    t.published("killed", 10.0).ev("started", "killed", 11, attempt=1)
    t.run("killed", 40, 41, attempt=2, worker="w2", pid=2)

    t.run("ghost", 11, 12)

    # Killed after the store recorded the completion, before the event was written: the
    # other copy was dropped because the store said "completed" ("c").
    t.published("unobserved", 10.0, brokers=(A, B)).ev("started", "unobserved", 11, attempt=1)
    t.ev("delivered", "unobserved", 30, broker=B, worker="w2")
    t.ev("duplicate", "unobserved", 30, broker=B, worker="w2", detail={"status": "c"})

    t.published("gave-up", 10.0).run("gave-up", 11, 12, outcome="failed", attempt=1)
    t.ev("retried", "gave-up", 12, attempt=1)
    t.run("gave-up", 14, 15, outcome="failed", attempt=2).ev("dead_lettered", "gave-up", 15)

    t.published("failed", 10.0).run("failed", 11, 12, outcome="failed")

    # Given up, replayed by an operator, and run once more: completed after its replay.
    t.published("replayed", 10.0).run("replayed", 11, 12, outcome="failed")
    t.ev("dead_lettered", "replayed", 12).ev("replayed", "replayed", 50, worker=None)
    t.run("replayed", 51, 52, attempt=1, worker="w2")
    t.published("replayed-twice", 10.0).run("replayed-twice", 11, 12, outcome="failed")
    t.ev("dead_lettered", "replayed-twice", 12).ev("replayed", "replayed-twice", 50)
    t.run("replayed-twice", 51, 52, worker="w2").run("replayed-twice", 60, 61, worker="w3")
    t.published("replay-lost", 10.0).run("replay-lost", 11, 12, outcome="failed")
    t.ev("dead_lettered", "replay-lost", 12).ev("replayed", "replay-lost", 50)
    t.published("replay-gave-up", 10.0).run("replay-gave-up", 11, 12, outcome="failed")
    t.ev("dead_lettered", "replay-gave-up", 12).ev("replayed", "replay-gave-up", 50)
    t.run("replay-gave-up", 51, 52, outcome="failed").ev("dead_lettered", "replay-gave-up", 52)

    t.published("expired", 10.0, brokers=(A, B))
    t.ev("delivered", "expired", 99).ev("expired", "expired", 99)
    t.ev("delivered", "expired", 99, broker=B).ev("expired", "expired", 99, broker=B)

    t.published("pair", 10.0, brokers=(A, B)).run("pair", 11, 12)
    t.ev("delivered", "pair", 13, broker=B, worker="w2")
    t.ev("duplicate", "pair", 13, broker=B, worker="w2")

    t.published("same-id", 10.0, queue="q1").run("same-id", 11, 12, queue="q1")
    t.published("same-id", 10.0, queue="q2")

    # The worker's clock is 5 s behind the publisher's: it "completed" before the publish.
    t.published("skewed", 100.0).run("skewed", 95.2, 95.9)

    t.raw('{"ts_ms": 1, "event": "completed", "message_id": "tru')  # truncated write
    t.raw('{"ts_ms": "noon", "event": "started", "message_id": "wrong-type", "queue": "q"}')
    t.raw('{"event": "completed", "queue": "q"}')  # no ts_ms, no message_id
    t.raw('{"ts_ms": 1, "event": "exploded", "message_id": "unknown-event", "queue": "q"}')
    t.raw("[1, 2, 3]")
    t.raw("")  # blank lines are neither events nor errors
    return t


@pytest.fixture(scope="module")
def audited(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Any, int]:
    return _audit(spark, tmp_path_factory.mktemp("situations"), _situations())


def verdict(audited: tuple[dict, Any, int], mid: str, queue: str = "q") -> str:
    return str(audited[0][(queue, mid)]["verdict"])


def row(audited: tuple[dict, Any, int], mid: str, queue: str = "q") -> dict[str, Any]:
    return dict(audited[0][(queue, mid)])


def test_message_published_and_run_once_is_completed_once(audited):
    assert verdict(audited, "once") == "completed_once"


def test_confirmed_message_that_started_but_never_finished_is_lost(audited):
    assert verdict(audited, "lost-started") == "lost"


def test_confirmed_message_never_delivered_is_lost(audited):
    assert verdict(audited, "lost-undelivered") == "lost"


def test_unconfirmed_publish_without_outcome_is_not_lost(audited):
    assert verdict(audited, "unconfirmed") == "unconfirmed"


def test_two_sequential_completions_are_duplicated(audited):
    assert verdict(audited, "twice") == "duplicated"


def test_overlapping_runs_are_duplicated_even_with_one_completion(audited):
    r = row(audited, "overlap")
    assert (r["verdict"], r["overlap"], r["n_completed"]) == ("duplicated", True, 1)


def test_retry_on_another_host_is_not_an_overlap(audited):
    r = row(audited, "retried")
    assert (r["verdict"], r["overlap"], r["n_retried"]) == ("completed_once", False, 1)


def test_overlap_shorter_than_the_skew_tolerance_is_not_reported(audited):
    assert verdict(audited, "skewed-retry") == "completed_once"


def test_run_without_an_end_cannot_make_an_overlap(audited):
    assert verdict(audited, "killed") == "completed_once"


def test_completion_never_published_is_unexpected(audited):
    assert verdict(audited, "ghost") == "unexpected"


def test_completion_known_only_from_the_stores_duplicate_verdict_is_not_lost(audited):
    r = row(audited, "unobserved")
    assert (r["verdict"], r["completion_unobserved"]) == ("completed_once", True)


def test_message_that_gave_up_is_dead_lettered_not_lost(audited):
    r = row(audited, "gave-up")
    assert (r["verdict"], r["n_retried"]) == ("dead_lettered", 1)


def test_a_dead_letter_replayed_and_run_once_is_replayed_not_unexpected(audited):
    assert verdict(audited, "replayed") == "replayed"


def test_a_replay_that_runs_twice_is_duplicated(audited):
    assert verdict(audited, "replayed-twice") == "duplicated"


def test_a_replay_that_never_ran_is_lost(audited):
    assert verdict(audited, "replay-lost") == "lost"


def test_a_replay_that_gave_up_again_is_dead_lettered(audited):
    assert verdict(audited, "replay-gave-up") == "dead_lettered"


def test_failure_without_retry_or_dead_letter_is_failed(audited):
    assert verdict(audited, "failed") == "failed"


def test_expired_message_is_expired_not_lost(audited):
    assert verdict(audited, "expired") == "expired"


def test_redundant_pair_on_two_brokers_is_one_message_completed_once(audited):
    r = row(audited, "pair")
    assert (r["verdict"], r["n_published_brokers"], r["n_published"]) == ("completed_once", 2, 2)
    assert sorted(r["delivered_brokers"]) == [A, B]
    assert sorted(r["published_brokers"]) == [A, B]


def test_same_message_id_on_two_queues_is_two_messages(audited):
    assert verdict(audited, "same-id", "q1") == "completed_once"
    assert verdict(audited, "same-id", "q2") == "lost"


def test_clock_skew_never_turns_a_completion_into_a_loss(audited):
    r = row(audited, "skewed")
    assert r["verdict"] == "completed_once"
    assert (r["publish_to_start_ms"], r["publish_to_complete_ms"]) == (0, 0)
    assert r["start_to_complete_ms"] == 700


def test_malformed_lines_are_counted_and_do_not_stop_the_audit(audited):
    rows, _, malformed = audited
    assert malformed == 5
    assert not {"wrong-type", "unknown-event", "tru"} & {mid for _, mid in rows}


def test_broker_tables_count_each_copy_and_coverage_counts_pairs(audited):
    from celery_beetle.audit import aggregates

    classified = audited[1]
    _timeline, table = aggregates.timeline_and_brokers(classified, span=(None, None))
    brokers = {r["broker"]: r for r in table}
    # lost-undelivered, unobserved, overlap, expired, pair
    assert brokers[B]["published_messages"] == 5
    deliveries = sum(len(r["delivered_brokers"]) for r in classified.collect())
    assert sum(r["deliveries"] for r in table) == deliveries
    coverage = aggregates.redundancy_coverage(classified)
    assert coverage["redundant_messages"] == coverage["on_two_or_more_brokers"] == 5


def test_verdict_counts_and_latency_percentiles_cover_every_message(spark, tmp_path, trace):
    from celery_beetle.audit import aggregates

    trace.published("ok", 10.0).run("ok", 10.5, 11.0)
    trace.published("lost", 10.0)
    trace.run("ghost", 11, 12)
    _, classified, _ = _audit(spark, tmp_path, trace)
    counts = aggregates.verdict_counts(classified)
    assert counts["messages"] == 3
    assert (counts["completed_once"], counts["lost"], counts["unexpected"]) == (1, 1, 1)
    lat = {(r["task_name"], r["queue"]): r for r in aggregates.latency_percentiles(classified)}
    assert lat[("*", "*")]["publish_to_start_p50_ms"] == 500
    assert lat[("t.add", "q")]["completed"] == 2
    samples = aggregates.samples(classified)
    assert samples["lost"] == ["q/lost"] and samples["unexpected"] == ["q/ghost"]


def test_run_audit_writes_tables_summary_and_a_report_with_images(spark, tmp_path, trace):
    from celery_beetle.audit import job

    trace.published("ok", 10.0, brokers=("a:5672", "b:5672")).run("ok", 10.5, 11.0)
    trace.published("lost", 10.0)
    trace.raw("not json")
    trace.write(tmp_path / "trace")
    out = tmp_path / "out"
    result = job.run_audit(spark, str(tmp_path / "trace" / "*.jsonl"), str(out), tables=True)
    summary = json.loads((out / "summary.json").read_text())
    assert not result.ok and summary["ok"] is False
    assert {k: summary[k] for k in ("messages", "completed_once", "lost", "malformed_lines")} == {
        "messages": 2,
        "completed_once": 1,
        "lost": 1,
        "malformed_lines": 1,
    }
    assert summary["samples"]["lost"] == ["q/lost"]
    assert summary["samples"]["malformed_lines"] == ["not json"]
    assert summary["latency_ms"]["publish_to_start"]["p50"] == 500
    assert (out / "messages" / "verdict=lost").is_dir()
    assert (out / "messages" / "verdict=completed_once").is_dir()
    assert (out / "latency").is_dir() and (out / "brokers").is_dir()
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') >= 3
    assert "FAIL" in html


def test_without_tables_only_the_summary_and_report_are_written(spark, tmp_path, trace):
    from celery_beetle.audit import job

    trace.published("ok", 10.0).run("ok", 10.5, 11.0)
    trace.write(tmp_path / "trace")
    before = spark.conf.get("spark.sql.shuffle.partitions")
    result = job.run_audit(spark, str(tmp_path / "trace"), str(tmp_path / "out"))
    assert result.ok and result.summary["completed_once"] == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "summary.json"]
    assert spark.conf.get("spark.sql.shuffle.partitions") == before  # the session is left as found


def test_a_small_trace_is_grouped_in_one_partition_per_core(spark, tmp_path, trace):
    from celery_beetle.audit import job

    trace.published("ok", 10.0).write(tmp_path / "trace")
    cores = spark.sparkContext.defaultParallelism
    assert job.shuffle_partitions_for(spark, [str(tmp_path / "trace" / "*.jsonl")]) == cores


def test_empty_trace_gives_zero_counts_and_no_clean_verdict(spark, tmp_path):
    from celery_beetle.audit import job

    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "h-1-worker-0-000.jsonl").write_text("")
    result = job.run_audit(spark, str(tmp_path / "trace"), str(tmp_path / "out"))
    assert result.empty and not result.ok and result.summary["messages"] == 0
    assert result.summary["ok"] is False
    assert "FAIL" in (tmp_path / "out" / "report.html").read_text()


def test_the_timeline_counts_published_started_and_completed_per_second_and_broker(
    spark, tmp_path, trace
):
    from celery_beetle.audit import job

    for i in range(3):  # second 0: three published on a and b, run from b in second 1
        trace.published(f"m{i}", 100.0, brokers=("a:5672", "b:5672"))
        trace.run(f"m{i}", 101.2, 102.5, broker="b:5672")
    trace.published("late", 104.0, brokers=("a:5672",)).run("late", 104.1, 104.2)
    trace.write(tmp_path / "trace")
    result = job.run_audit(spark, str(tmp_path / "trace"), str(tmp_path / "out"))
    timeline = result.summary["timeline"]
    assert timeline["start_ms"] == 100_000 and timeline["bucket_s"] == 1
    rows = {(r["bucket"], r["event"], r["broker"]): r["messages"] for r in timeline["rows"]}
    assert rows == {
        (0, "published", "a:5672"): 3,
        (0, "published", "b:5672"): 3,
        (1, "started", "b:5672"): 3,
        (2, "completed", "b:5672"): 3,
        (4, "published", "a:5672"): 1,
        (4, "started", "a:5672"): 1,
        (4, "completed", "a:5672"): 1,
    }
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Over time" in html and 'alt="published, started and completed per second"' in html


def test_when_nothing_completed_the_overall_latency_is_empty_not_missing(spark, tmp_path, trace):
    from celery_beetle.audit import job

    trace.published("lost", 10.0).published("also-lost", 11.0)
    trace.write(tmp_path / "trace")
    summary = job.run_audit(spark, str(tmp_path / "trace"), str(tmp_path / "out")).summary
    assert summary["lost"] == 2 and summary["latency_by_task"] == []
    assert summary["latency_ms"]["publish_to_start"] == {"p50": None, "p90": None, "p99": None}
    assert summary["samples"]["lost"] == ["q/also-lost", "q/lost"]  # the first ids, in order


def test_a_parsed_malformed_line_is_shown_without_task_id(spark, tmp_path, trace):
    from celery_beetle.audit import job

    trace.published("ok", 10.0).run("ok", 10.5, 11.0)
    line = {"ts_ms": 1, "event": "teleported", "message_id": "m", "queue": "q", "task_id": "t"}
    trace.raw(json.dumps(line))
    trace.write(tmp_path / "trace")
    summary = job.run_audit(spark, str(tmp_path / "trace"), str(tmp_path / "out")).summary
    assert summary["malformed_lines"] == 1
    [shown] = summary["samples"]["malformed_lines"]
    assert '"event":"teleported"' in shown and "task_id" not in shown
