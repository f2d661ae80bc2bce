"""The ``beetle`` command's grammar, without servers: aliases, short ids, fleet's columns."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from celery_beetle.cli import main
from celery_beetle.ops import dead_letters
from celery_beetle.ops.dead_letters import DeadLetter
from celery_beetle.ops.fleet import FleetConsumer, FleetReport


def letter(message_id: str) -> DeadLetter:
    return DeadLetter(
        message_id=message_id,
        queue="jobs",
        scope="",
        replay_id="r",
        reason="not_retryable",
        body=b"",
        content_type="application/json",
        content_encoding="utf-8",
        headers={},
        properties={},
    )


def test_help_lists_dead_letters_once_and_the_dead_alias_still_answers():
    listed = CliRunner().invoke(main, ["--help"])
    assert "dead-letters" in listed.output
    assert "  dead " not in listed.output
    alias = CliRunner().invoke(main, ["dead", "list", "--help"])
    assert alias.exit_code == 0 and "-Q, --queue QUEUE" in alias.output


def test_a_short_id_is_the_shortest_unique_prefix_of_at_least_eight_characters():
    letters = [letter("8ada1f00-aaaa"), letter("8ada1f00-abbb"), letter("c0ffee00-1234")]
    assert dead_letters.short_ids(letters) == {
        "8ada1f00-aaaa": "8ada1f00-aa",
        "8ada1f00-abbb": "8ada1f00-ab",
        "c0ffee00-1234": "c0ffee00",
    }


def test_a_unique_prefix_names_its_dead_letter_and_a_whole_id_names_itself():
    letters = [letter("8ada1f00-aaaa"), letter("8ada1f00-abbb"), letter("8ada")]
    assert dead_letters.resolve_ids(letters, ["8ada1f00-aa", "8ada"], "jobs") == [
        "8ada1f00-aaaa",
        "8ada",
    ]


def test_a_task_id_names_every_dead_letter_of_that_task():
    """A frozen signature applied twice is two messages of one task id."""
    letters = [letter("m-1"), letter("m-2"), letter("m-3")]
    letters[0].headers["id"] = letters[1].headers["id"] = "task-a"
    letters[2].headers["id"] = "task-b"
    assert dead_letters.resolve_ids(letters, ["task-a"], "jobs") == ["m-1", "m-2"]
    assert letters[2].summary()["task_id"] == "task-b"


@pytest.mark.parametrize(
    ("given", "said"),
    [("nosuch", "no dead letter 'nosuch' in jobs.dead"), ("8ada1", "'8ada1' is the start of 2")],
)
def test_an_unknown_or_ambiguous_id_is_an_error_naming_it(given: str, said: str):
    letters = [letter("8ada1f00-aaaa"), letter("8ada1f00-abbb")]
    with pytest.raises(LookupError, match=said):
        dead_letters.resolve_ids(letters, [given], "jobs")


def test_fleet_lines_its_columns_up_under_the_header(monkeypatch: Any):
    from celery_beetle.ops import cli_queues, fleet

    consumers = [
        FleetConsumer("rabbit-one:5672", "celery", "c1", "beetle", "1.0", "beetle", "10.0.0.1:1"),
        FleetConsumer("r2:5672", "a-much-longer-queue", "c2", "celery", "5.5.3", "plain", "p"),
    ]
    monkeypatch.setattr(cli_queues, "_clients", lambda *args: ["one", "two"])
    monkeypatch.setattr(fleet, "survey", lambda *args: FleetReport(consumers, {}, "1.0"))
    result = CliRunner().invoke(main, ["fleet", "--broker", "beetle://h1,h2/"])
    header, *rows = result.output.splitlines()[:3]
    for column in ("broker", "queue", "client", "peer"):
        start = header.index(column)
        assert all(row[start - 2 : start] == "  " and row[start] != " " for row in rows), (
            column,
            result.output,
        )


def test_fleet_without_an_answering_management_api_is_an_error_and_prints_no_table(
    monkeypatch: Any,
):
    from celery_beetle.ops import cli_queues, fleet

    monkeypatch.setattr(cli_queues, "_clients", lambda *args: ["one"])
    failed = FleetReport([], {"h1:5672": "GET http://h1:15672/api/consumers: refused"}, "1.0")
    monkeypatch.setattr(fleet, "survey", lambda *args: failed)
    result = CliRunner().invoke(main, ["fleet", "--broker", "beetle://h1/"])
    assert result.exit_code == 1
    assert "consumer(s)" not in result.output and "kind" not in result.output
    assert "h1:5672" in result.output and "management plugin" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["outbox", "drop", "--id", "m-1"],
        ["outbox", "retry", "--id", "m-1"],
        ["dead-letters", "show", "--id", "m-1", "-Q", "jobs"],
        ["dead-letters", "purge", "m-1", "-Q", "jobs"],
    ],
)
def test_ids_are_taken_positional_or_with_id_everywhere(args: list[str]):
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "[ID]..." in result.output or "[IDS]..." in result.output
    assert "--id" in result.output


def test_a_queue_given_the_old_way_works_with_a_deprecation_warning(monkeypatch: Any):
    monkeypatch.setattr(dead_letters, "list_dead_letters", lambda url, queue: ([], {}))
    old = CliRunner().invoke(main, ["dead", "list", "jobs", "--broker", "beetle://h1/"])
    new = CliRunner().invoke(main, ["dead", "list", "-Q", "jobs", "--broker", "beetle://h1/"])
    assert old.exit_code == new.exit_code == 0
    assert "deprecated" in old.output and "-Q jobs" in old.output
    assert "deprecated" not in new.output and "jobs.dead: 0 dead letter(s)" in new.output


def test_every_command_that_names_one_queue_spells_it_dash_q():
    from tests.ops.test_cli_bad_input import command_at, leaf_commands

    for path in leaf_commands(main):
        for param in command_at(path).params:
            if param.name in ("queue", "queues", "names"):
                assert "-Q" in param.opts and "--queue" in param.opts, (path, param.opts)


@pytest.mark.parametrize(
    "path",
    [
        ("dead-letters", "list"),
        ("dead-letters", "replay"),
        ("fleet",),
        ("outbox", "list"),
        ("status",),
    ],
)
def test_every_listing_has_json(path: tuple[str, ...]):
    from tests.ops.test_cli_bad_input import command_at

    assert "--json" in {opt for param in command_at(path).params for opt in param.opts}


def test_status_json_says_each_broker_and_the_store_and_exits_1_when_one_is_down(monkeypatch: Any):
    import json

    from celery_beetle.cli import report

    down = report.BrokerStatus("h2:5672", up=False, error="ConnectionRefusedError")
    up = report.BrokerStatus("h1:5672", up=True, version="3.13.7", queues={"celery": (3, 1)})
    monkeypatch.setattr(report, "brokers", lambda url, queues: [up, down])
    store = report.StoreStatus("redis://h", up=True, latency_ms=0.5, keys=2, used_memory="1M")
    monkeypatch.setattr(report, "store", lambda url: store)
    result = CliRunner().invoke(
        main, ["status", "-b", "beetle://h1,h2/", "--redis", "redis://h", "-Q", "celery", "--json"]
    )
    assert result.exit_code == 1
    found = json.loads(result.output)
    assert found["brokers"][0]["queues"] == {"celery": {"ready": 3, "consumers": 1}}
    assert found["brokers"][1]["error"] == "ConnectionRefusedError"
    assert found["store"]["keys"] == 2


def test_status_takes_the_broker_url_with_broker_and_the_old_argument_with_a_warning(
    monkeypatch: Any,
):
    from celery_beetle.cli import report

    seen: list[str] = []
    monkeypatch.setattr(report, "brokers", lambda url, queues: seen.append(url) or [])
    new = CliRunner().invoke(main, ["status", "--broker", "beetle://h1,h2/"])
    old = CliRunner().invoke(main, ["status", "beetle://h1,h2/"])
    assert new.exit_code == old.exit_code == 0 and seen == ["beetle://h1,h2/"] * 2
    assert "deprecated" in old.output and "deprecated" not in new.output


def test_every_command_that_reads_brokers_takes_them_with_broker():
    from tests.ops.test_cli_bad_input import command_at, leaf_commands

    for path in leaf_commands(main):
        for param in command_at(path).params:
            if param.name == "broker_url":
                assert "--broker" in param.opts and "-b" in param.opts, (path, param.opts)
