"""``beetle dead-letters`` on real brokers: ids pasted from the table, and reads that fail
loudly rather than report nothing."""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner

from celery_beetle.cli import main
from celery_beetle.testing.rabbit import RabbitNode
from tests.ops.test_cli_bad_input import dead_letter

pytestmark = pytest.mark.integration

FIRST = "8ada1f00-0000-4000-8000-000000000001"
SECOND = "8ada1f00-0000-4000-8000-000000000002"
THIRD = "c0ffee00-0000-4000-8000-000000000003"
NARROW = {"COLUMNS": "80", "BEETLE_BROKER_URL": None, "BEETLE_REDIS_URL": None}


def beetle(*args: str, **env: Any) -> Any:
    return CliRunner().invoke(main, list(args), env={**NARROW, **env})


def test_an_id_pasted_from_an_80_column_table_shows_and_replays_its_dead_letter(brokers, redis_url):
    for message_id in (FIRST, SECOND, THIRD):
        dead_letter(brokers, "jobs", message_id)
    table = beetle("dead-letters", "list", "-Q", "jobs", "--broker", brokers.beetle_url)
    assert table.exit_code == 0, table.output
    shown = sorted(re.findall(r"(?:8ada1f00|c0ffee00)[0-9a-f-]*", table.output))
    # never cut: the two that differ only at the end whole, the third its first 8 characters
    assert shown == [FIRST, SECOND, THIRD[:8]], table.output
    show = beetle("dead", "show", shown[2], "-Q", "jobs", "--broker", brokers.beetle_url)
    assert show.exit_code == 0 and THIRD in show.output, show.output
    dry = beetle(
        "dead", "replay", "-Q", "jobs", "--id", shown[2], "--dry-run",
        "--broker", brokers.beetle_url, "--redis", redis_url,
    )  # fmt: skip
    assert THIRD in dry.output and "1 dead letter(s) (dry run)" in dry.output, dry.output


def test_an_ambiguous_or_unknown_prefix_is_an_error_naming_it(brokers, redis_url):
    dead_letter(brokers, "jobs", FIRST)
    dead_letter(brokers, "jobs", SECOND)
    for command in (["show"], ["purge", "--yes"], ["replay", "--dry-run", "--redis", redis_url]):
        for given, said in (("8ada1", "'8ada1' is the start of 2"), ("ffff", "'ffff'")):
            result = beetle(
                "dead",
                command[0],
                given,
                "-Q",
                "jobs",
                *command[1:],
                "--broker",
                brokers.beetle_url,
            )
            assert result.exit_code == 2 and said in result.output, (command, result.output)
    assert (
        beetle("dead", "list", "-Q", "jobs", "--json", "--broker", brokers.beetle_url).output.count(
            "8ada1f00"
        )
        == 2
    )  # nothing purged


def test_a_queue_that_does_not_exist_is_an_error_not_zero_dead_letters(brokers):
    result = beetle("dead", "list", "-Q", "nosuchqueue", "--broker", brokers.beetle_url)
    assert result.exit_code == 2, result.output
    assert "no queue 'nosuchqueue'" in result.output
    assert "0 dead letter(s)" not in result.output


def test_a_wrong_broker_password_is_an_error_not_zero_dead_letters(brokers, redis_url):
    dead_letter(brokers, "jobs", FIRST)
    wrong = brokers.beetle_url.replace(f":{RabbitNode.password}@", ":wrong@")
    for args in (["list"], ["replay", "--all", "--dry-run", "--redis", redis_url]):
        result = beetle("dead", args[0], "-Q", "jobs", *args[1:], "--broker", wrong)
        assert result.exit_code == 1, result.output
        assert "ACCESS_REFUSED" in result.output and "password" in result.output
        assert "dead letter(s)" not in result.output
