"""Dead letters listed and replayed (:mod:`celery_beetle.ops.dead_letters`) on real brokers
and a real worker: each replayed message runs exactly once."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from celery_beetle.cli import main
from celery_beetle.ops.dead_letters import list_dead_letters
from celery_beetle.ops.management import clients_for_url
from celery_beetle.ops.policies import PolicyConfig, apply
from celery_beetle.ops.replay import kombu_publisher, replay
from celery_beetle.store import RedisStore
from tests.exactly_once.conftest import FAST, counts
from tests.harness.waiting import wait_until
from tests.ops.conftest import management_config

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_url):  # type: ignore[no-untyped-def]
    s = RedisStore.from_url(redis_url)
    yield s
    s.close()


def broken_worker(eo_worker, tmp_path):  # type: ignore[no-untyped-def]
    broken = tmp_path / "broken"
    broken.touch()
    worker = eo_worker(extra_env={"BEETLE_TEST_BROKEN": str(broken)})
    return worker, broken


def dead_letter_count(brokers) -> int:  # type: ignore[no-untyped-def]
    """Copies in ``celery.dead`` over all nodes (a worker's dead letter has two)."""
    return sum(depths.get("celery.dead", (0, 0))[0] for depths in brokers.queue_depths())


def drained(brokers) -> bool:  # type: ignore[no-untyped-def]
    """Every copy published to ``celery`` was taken and acked (run or dropped)."""
    return all(depths.get("celery") == (0, 0) for depths in brokers.queue_depths())


def give_up(app, worker, brokers, items):  # type: ignore[no-untyped-def]
    ids = [app.tasks["eo.fixable"].delay(i).id for i in items]
    assert wait_until(lambda: dead_letter_count(brokers) == 2 * len(items), 20)
    return ids


def test_a_dead_letter_is_listed_shown_and_replayed_once_after_the_bug_is_fixed(
    brokers, client, eo_worker, store, tmp_path
):
    worker, broken = broken_worker(eo_worker, tmp_path)
    app = client()
    (task_id,) = give_up(app, worker, brokers, [7])
    letters, errors = list_dead_letters(brokers.beetle_url, "celery")
    assert errors == {}
    assert [(d.message_id, d.task, d.reason) for d in letters] == [
        (task_id, "eo.fixable", "not_retryable")
    ]
    assert len(letters[0].brokers) == 2, "the dead letter is on two brokers, shown once"
    assert dead_letter_count(brokers) == 2, "listing removes nothing"
    details = letters[0].details()
    assert details["exception"] == "builtins.KeyError"
    assert json.loads(details["arguments"]) == {"args": [7], "kwargs": {}}
    broken.unlink()
    results = replay(brokers.beetle_url, "celery", store, ids=[task_id], transport_options=FAST)
    assert [(r.outcome, r.acked) for r in results] == [("run", True)]
    assert wait_until(lambda: counts([worker])[7] == 1, 15)
    assert dead_letter_count(brokers) == 0
    again = replay(brokers.beetle_url, "celery", store, everything=True, transport_options=FAST)
    assert again == []
    assert counts([worker], "start")[7] == 2  # the broken run, and the replay
    assert counts([worker])[7] == 1


def test_a_replay_interrupted_after_publishing_and_run_again_runs_the_message_once(
    brokers, client, eo_worker, store, tmp_path
):
    worker, broken = broken_worker(eo_worker, tmp_path)
    give_up(client(), worker, brokers, [8])
    broken.unlink()

    @contextmanager
    def dies_after_publishing():  # type: ignore[no-untyped-def]
        with kombu_publisher(brokers.beetle_url, FAST) as publish:

            def publish_then_die(letter, headers):  # type: ignore[no-untyped-def]
                publish(letter, headers)
                raise KeyboardInterrupt  # killed before the mark and the ack

            yield publish_then_die

    with pytest.raises(KeyboardInterrupt):
        replay(
            brokers.beetle_url, "celery", store, everything=True, publisher=dies_after_publishing()
        )
    assert wait_until(lambda: counts([worker])[8] == 1, 15)
    assert dead_letter_count(brokers) == 2, "the dead letter was not acked"
    results = replay(brokers.beetle_url, "celery", store, everything=True, transport_options=FAST)
    assert [r.outcome for r in results] == ["republish"]
    assert dead_letter_count(brokers) == 0
    assert wait_until(lambda: drained(brokers), 15)
    assert counts([worker])[8] == 1, "the second publish was dropped as a duplicate"
    assert counts([worker], "start")[8] == 2  # the broken run and one replayed run


def test_two_replays_at_once_run_each_message_once(brokers, client, eo_worker, store, tmp_path):
    worker, broken = broken_worker(eo_worker, tmp_path)
    items = [21, 22, 23]
    ids = give_up(client(), worker, brokers, items)
    broken.unlink()
    barrier = threading.Barrier(2)
    results: list = []

    def run() -> None:
        barrier.wait()
        results.extend(
            replay(brokers.beetle_url, "celery", store, everything=True, transport_options=FAST)
        )

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert wait_until(lambda: all(counts([worker])[i] == 1 for i in items), 15)
    assert dead_letter_count(brokers) == 0
    assert {r.letter.message_id for r in results if r.acked} == set(ids)
    assert wait_until(lambda: drained(brokers), 15)
    assert [counts([worker])[i] for i in items] == [1, 1, 1]


def test_broker_dead_letters_of_both_copies_are_replayed_into_one_run(
    brokers, client, eo_worker, store
):
    """Both copies of a redundant message expire through the queue's policy (no worker
    yet): two dead letters on two brokers; replaying both runs the message once."""
    clients = clients_for_url(brokers.beetle_url, management_config(brokers))
    for node in brokers.nodes:
        conn = node.connect(brokers.vhost)
        conn.channel().queue_declare("celery", durable=True)
        conn.close()
    ttl = PolicyConfig.from_mapping({"queues": {"celery": {"message_ttl_ms": 100}}})
    apply(clients, ["celery"], ttl)
    task_id = client().tasks["eo.record"].delay(31).id
    assert wait_until(lambda: dead_letter_count(brokers) == 2, 10)
    letters, _ = list_dead_letters(brokers.beetle_url, "celery")
    assert {(d.message_id, d.reason) for d in letters} == {(task_id, "broker:expired")}
    apply(clients, ["celery"], PolicyConfig())  # the TTL goes, without re-creating the queue
    worker = eo_worker()
    results = replay(brokers.beetle_url, "celery", store, everything=True, transport_options=FAST)
    # one entry, whatever second each broker stamped in x-death
    assert [(r.outcome, len(r.letter.copies), r.acked) for r in results] == [("run", 2, True)]
    assert wait_until(lambda: counts([worker])[31] == 1, 15)
    assert wait_until(lambda: drained(brokers), 15)
    assert counts([worker], "start")[31] == 1


def test_cli_lists_dead_letters_as_json_and_replays_by_task(
    brokers, client, eo_worker, redis_url, tmp_path
):
    worker, broken = broken_worker(eo_worker, tmp_path)
    (task_id,) = give_up(client(), worker, brokers, [41])
    env = {"BEETLE_BROKER_URL": brokers.beetle_url, "BEETLE_REDIS_URL": redis_url}
    runner = CliRunner()
    listed = runner.invoke(main, ["dead", "list", "-Q", "celery", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    (entry,) = json.loads(listed.output)
    assert entry["message_id"] == task_id and entry["reason"] == "not_retryable"
    shown = runner.invoke(main, ["dead-letters", "show", "-Q", "celery", task_id], env=env)
    assert shown.exit_code == 0 and '"args": [41]' in json.loads(shown.output)["arguments"]
    dry = runner.invoke(
        main, ["dead", "replay", "-Q", "celery", "--task", "eo.fixable", "--dry-run"], env=env
    )
    assert "run: dry run" in dry.output and dead_letter_count(brokers) == 2
    broken.unlink()
    done = runner.invoke(main, ["dead", "replay", "-Q", "celery", "--task", "eo.fixable"], env=env)
    assert done.exit_code == 0, done.output
    assert f"{task_id}  eo.fixable  run: published to celery" in done.output
    assert wait_until(lambda: counts([worker])[41] == 1, 15)


def test_the_audit_counts_a_replayed_message_as_replayed(
    brokers, client, eo_worker, store, tmp_path, spark
):
    from celery_beetle.audit.job import run_audit
    from kombu_beetle.trace import flush_all, get_tracer

    trace = tmp_path / "trace"
    broken = tmp_path / "broken"
    broken.touch()
    worker = eo_worker(trace_dir=str(trace), extra_env={"BEETLE_TEST_BROKEN": str(broken)})
    app = client(trace_dir=str(trace))
    (task_id,) = give_up(app, worker, brokers, [8])
    broken.unlink()
    tracer = get_tracer(str(trace), role="ops")
    results = replay(
        brokers.beetle_url, "celery", store, ids=[task_id], transport_options=FAST, tracer=tracer
    )
    assert [r.outcome for r in results] == ["run"]
    assert wait_until(lambda: counts([worker])[8] == 1, 15)
    worker.stop()
    flush_all()
    summary = run_audit(spark, str(trace), str(tmp_path / "audit")).summary
    verdict = {k: summary[k] for k in ("messages", "replayed", "lost", "duplicated", "unexpected")}
    assert verdict == {"messages": 1, "replayed": 1, "lost": 0, "duplicated": 0, "unexpected": 0}
