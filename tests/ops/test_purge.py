"""``beetle dead purge`` removes only the dead letters it names, every copy of them; ``list``."""

from __future__ import annotations

import time

import pika
import pytest
from click.testing import CliRunner

from celery_beetle.cli import main
from celery_beetle.ops.dead_letters import list_dead_letters, purge
from celery_beetle.worker.deadletter import dead_letter_headers

pytestmark = pytest.mark.integration


def dead_letter(nodes, vhost, message_id, *, age_s=0.0, task="t.a"):  # type: ignore[no-untyped-def]
    """A dead letter as the worker writes it, a copy on each of ``nodes``."""
    at = int((time.time() - age_s) * 1000)
    headers = dead_letter_headers("not_retryable", "jobs", now_ms=at, worker="w1")
    properties = pika.BasicProperties(
        message_id=message_id, headers={"task": task, **headers}, delivery_mode=2
    )
    for node in nodes:
        conn = node.connect(vhost)
        try:
            channel = conn.channel()
            channel.queue_declare("jobs.dead", durable=True)
            channel.basic_publish("", "jobs.dead", b"[[1], {}, {}]", properties)
        finally:
            conn.close()


def ids(brokers) -> list[str]:  # type: ignore[no-untyped-def]
    letters, _ = list_dead_letters(brokers.beetle_url, "jobs")
    return sorted(d.message_id or "" for d in letters)


def test_purge_removes_every_copy_of_what_it_names_and_nothing_else(brokers):
    dead_letter(brokers.nodes[:2], brokers.vhost, "m-1")  # one dead letter, two copies
    dead_letter(brokers.nodes[:1], brokers.vhost, "m-2")
    dead_letter(brokers.nodes[2:], brokers.vhost, "m-3", age_s=86400 * 3)
    removed = purge(brokers.beetle_url, "jobs", ids=["m-1"])
    assert [(d.message_id, len(d.copies)) for d in removed] == [("m-1", 2)]
    assert ids(brokers) == ["m-2", "m-3"]
    old = purge(brokers.beetle_url, "jobs", dead_before_ms=int((time.time() - 86400) * 1000))
    assert [d.message_id for d in old] == ["m-3"]
    assert ids(brokers) == ["m-2"]


def test_the_cli_asks_before_purging_and_yes_skips_the_question(brokers):
    dead_letter(brokers.nodes[:1], brokers.vhost, "m-1")
    env = {"BEETLE_BROKER_URL": brokers.beetle_url}
    runner = CliRunner()
    declined = runner.invoke(main, ["dead", "purge", "-Q", "jobs", "--all"], input="n\n", env=env)
    assert declined.exit_code == 1 and "m-1" in declined.output
    assert ids(brokers) == ["m-1"]
    done = runner.invoke(main, ["dead", "purge", "-Q", "jobs", "--id", "m-1", "--yes"], env=env)
    assert done.exit_code == 0 and "1 dead letter(s) removed" in done.output
    assert ids(brokers) == []


def test_list_prints_one_row_per_dead_letter_naming_the_brokers_that_hold_it(brokers):
    dead_letter(brokers.nodes[:2], brokers.vhost, "m-1")
    result = CliRunner().invoke(
        main,
        ["dead", "list", "-Q", "jobs"],
        env={"BEETLE_BROKER_URL": brokers.beetle_url, "COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "m-1" in line)
    assert "t.a" in row and "not_retryable" in row
    assert brokers.nodes[0].host_port in result.output
    assert "1 dead letter(s)" in result.output
