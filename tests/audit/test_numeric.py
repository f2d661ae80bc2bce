"""The numbers-only grouping (:mod:`celery_beetle.audit.numeric`) against the lists.

Every situation of test_transforms, and a few that only the numbers-only grouping finds
hard, must get the same per-message facts and verdict from both groupings; what it cannot
judge exactly it must say so, and the audit then judges those messages again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.audit.conftest import TraceBuilder
from tests.audit.test_transforms import A, B, _situations

pytestmark = pytest.mark.spark

COMPARED = (
    "verdict",
    "overlap",
    "task_name",
    "completion_unobserved",
    "redundant",
    "n_published_brokers",
    "n_started",
    "n_completed",
    "n_retried",
    "first_published_ms",
    "first_started_ms",
    "last_started_ms",
    "first_completed_ms",
    "started_broker",
    "completed_broker",
    "publish_to_start_ms",
    "start_to_complete_ms",
    "publish_to_complete_ms",
)


def _hard(t: TraceBuilder) -> TraceBuilder:
    """Situations beyond two runs of one start each."""
    # the same attempt on the same process started twice (a redelivery), overlapping itself
    t.published("restarted", 10.0).ev("started", "restarted", 11, attempt=1)
    t.run("restarted", 12, 15, attempt=1)
    # ... and once more after its end: no overlap
    t.published("restarted-later", 10.0).run("restarted-later", 11, 12, attempt=1)
    t.ev("started", "restarted-later", 20, attempt=1)
    # three runs one after the other, and three runs of which the last two overlap
    t.published("three", 10.0).run("three", 11, 12, outcome="failed", attempt=1)
    t.run("three", 13, 14, outcome="failed", attempt=2, worker="w2")
    t.run("three", 15, 16, attempt=3, worker="w3")
    t.published("three-overlapping", 10.0).run("three-overlapping", 11, 12, "failed", 1)
    t.run("three-overlapping", 13, 19, outcome="failed", attempt=2, worker="w2")
    t.run("three-overlapping", 15, 17, attempt=3, worker="w3")
    # a run started three times
    t.published("thrice", 10.0).ev("started", "thrice", 11, attempt=1)
    t.ev("started", "thrice", 12, attempt=1).run("thrice", 13, 14, attempt=1)
    # two runs sharing neither end nor worker, the second inside the first
    t.published("nested", 10.0).run("nested", 11, 20).run("nested", 12, 14, worker="w2")
    # a task name and a broker the sample does not know
    t.published("unknown-task", 10.0, task_name="t.other").run("unknown-task", 11, 12)
    t.published("unknown-broker", 10.0, brokers=("c:5672",)).run("unknown-broker", 11, 12)
    return t


def _rows(spark: Any, directory: Path, names: Any) -> dict[tuple[str, str], dict[str, Any]]:
    from celery_beetle.audit import numeric
    from celery_beetle.audit import transforms as T

    raw = spark.read.schema(T.READ_SCHEMA).options(**T.read_options()).json(str(directory))
    events = T.mark_malformed(raw)
    facts = T.per_message(events) if names is None else numeric.per_message(events, names)
    messages, malformed = T.split_malformed(facts)
    rows = {(r["queue"], r["message_id"]): r.asDict() for r in T.classify(messages).collect()}
    m = malformed.first()
    rows[("", "malformed")] = {k: m[k] for k in ("malformed_lines", "bad_line_min", "bad_line_max")}
    return rows


@pytest.fixture(scope="module")
def both(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    from celery_beetle.audit.names import Names

    directory = tmp_path_factory.mktemp("numeric")
    _hard(_situations()).write(directory)
    names = Names(brokers=(A, B), tasks=("t.add",))
    return _rows(spark, directory, None), _rows(spark, directory, names)


def _exact(numbers: dict, key: tuple[str, str]) -> bool:
    return bool(numbers[key]["exact"])


def test_numbers_only_give_every_exactly_judged_message_the_facts_of_the_lists(both):
    lists, numbers = both
    assert lists.keys() == numbers.keys()
    judged = [k for k in lists if k[0] and _exact(numbers, k)]
    assert len(judged) >= 20
    for key in judged:
        mine, theirs = numbers[key], lists[key]
        assert {k: mine[k] for k in COMPARED} == {k: theirs[k] for k in COMPARED}, key
        for col in ("published_brokers", "delivered_brokers"):
            assert sorted(mine[col]) == sorted(theirs[col]), (key, col)


def test_malformed_lines_are_counted_by_their_text_with_the_same_samples(both):
    lists, numbers = both
    assert numbers[("", "malformed")] == lists[("", "malformed")]
    assert numbers[("", "malformed")]["malformed_lines"] == 5


def test_a_run_started_twice_that_overlaps_itself_is_duplicated(both):
    lists, numbers = both
    assert _exact(numbers, ("q", "restarted"))
    assert numbers[("q", "restarted")]["verdict"] == lists[("q", "restarted")]["verdict"]
    assert numbers[("q", "restarted")]["verdict"] == "duplicated"
    assert numbers[("q", "restarted-later")]["verdict"] == "completed_once"


def test_a_run_inside_another_is_an_overlap(both):
    _, numbers = both
    assert numbers[("q", "nested")]["verdict"] == "duplicated"


@pytest.mark.parametrize(
    "mid", ["three", "three-overlapping", "thrice", "unknown-task", "unknown-broker"]
)
def test_three_runs_a_run_started_thrice_and_unsampled_names_are_marked_inexact(both, mid):
    _, numbers = both
    assert not _exact(numbers, ("q", mid))


def test_the_audit_judges_inexact_messages_again_from_their_events(spark, tmp_path, both):
    from celery_beetle.audit import job

    lists, _ = both
    _hard(_situations()).write(tmp_path / "trace")
    out = tmp_path / "out"
    summary = job.run_audit(spark, str(tmp_path / "trace"), str(out), samples_per_class=100)
    summary = summary.summary
    expected: dict[str, int] = {}
    for (queue, _mid), row in lists.items():
        if queue:
            expected[row["verdict"]] = expected.get(row["verdict"], 0) + 1
    assert {v: summary[v] for v in expected} == expected
    assert "q/three-overlapping" in summary["samples"]["duplicated"]
    assert "q/three" not in summary["samples"]["duplicated"]
    assert "q/thrice" in summary["samples"]["duplicated"]
    assert json.loads((out / "summary.json").read_text())["messages"] == len(lists) - 1


def test_timeline_and_broker_table_from_numbers_equal_those_from_the_lists(spark, tmp_path):
    from celery_beetle.audit import aggregates, numeric
    from celery_beetle.audit import transforms as T
    from celery_beetle.audit.names import Names

    t = _situations()
    t.published("third", 10.0, brokers=("c:5672",)).run("third", 11, 12, broker="c:5672")
    t.write(tmp_path / "trace")
    raw = spark.read.schema(T.READ_SCHEMA).options(**T.read_options()).json(str(tmp_path / "trace"))
    events = T.mark_malformed(raw)
    names = Names(brokers=(A, B, "c:5672", "d:5672"), tasks=("t.add",))
    by_lists = T.classify(T.split_malformed(T.per_message(events))[0])
    by_numbers = T.classify(T.split_malformed(numeric.per_message(events, names))[0])
    assert by_numbers.where("not exact").count() == 1  # replayed-twice: three runs
    exact = by_numbers.where("exact").select("queue", "message_id")
    by_lists, by_numbers = by_lists.join(exact, ["queue", "message_id"]), by_numbers.where("exact")
    span = (10_000, 61_000)
    expected = aggregates.timeline_and_brokers(by_lists, span=span, max_buckets=20)
    assert aggregates.timeline_and_brokers(by_numbers, span, 20, brokers=names.brokers) == expected
    assert {r["broker"] for r in expected[1]} == {A, B, "c:5672"}  # d:5672 was never seen


def _random_runs(seed: int, messages: int) -> TraceBuilder:
    """Messages with one or two runs, each started once or twice, finished or not, on one
    or two worker processes, at random times a few seconds apart."""
    import random

    rng = random.Random(seed)
    t = TraceBuilder()
    for m in range(messages):
        mid = f"r{m}"
        t.published(mid, 10.0)
        for run in range(rng.choice((1, 1, 2))):
            worker, pid = rng.choice((("w1", 1), ("w1", 2), ("w2", 1))), rng.choice((1, 2))
            kw = {"attempt": rng.choice((None, 1, 2)), "worker": worker[0], "pid": pid}
            start = 11 + rng.random() * 4
            for _ in range(rng.choice((1, 1, 2)) if run == 0 else 1):
                t.ev("started", mid, start + rng.random() * 2, **kw)
            if rng.random() < 0.8:
                t.ev(rng.choice(("completed", "failed")), mid, start + rng.random() * 4, **kw)
    return t


def test_random_runs_get_the_facts_of_the_lists_when_judged_exactly(spark, tmp_path):
    from celery_beetle.audit.names import Names

    _random_runs(seed=7, messages=400).write(tmp_path / "trace")
    names = Names(brokers=(A, B), tasks=("t.add",))
    lists, numbers = _rows(spark, tmp_path / "trace", None), _rows(spark, tmp_path / "trace", names)
    judged = [k for k in lists if k[0] and _exact(numbers, k)]
    assert len(judged) >= 300
    assert {numbers[k]["verdict"] for k in judged} >= {"duplicated", "completed_once"}
    for key in judged:
        mine, theirs = numbers[key], lists[key]
        assert {k: mine[k] for k in COMPARED} == {k: theirs[k] for k in COMPARED}, key


def test_names_are_sampled_from_the_head_and_the_tail_of_each_file(tmp_path):
    from celery_beetle.audit import names

    t = TraceBuilder().published("first", 10.0, brokers=(A,))
    for i in range(3000):  # ~800 KB between them
        t.published(f"m{i}", 11.0, brokers=(A,))
    t.published("last", 12.0, brokers=(B,), task_name="t.last")
    t.write(tmp_path / "trace")
    (tmp_path / "trace" / "_SUCCESS").write_text('{"broker": "hidden"}\n')
    found = names.sample([str(tmp_path / "trace")])
    assert found == names.Names(brokers=(A, B), tasks=("t.add", "t.last"))
    assert names.sample(["s3a://bucket/trace"]) is None
