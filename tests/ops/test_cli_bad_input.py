"""Every command of ``beetle``, fed what an operator can mistype or meet, answers in one line.

The commands are found by walking the click group, so a command added later is walked too.
Each scenario replaces one input with a bad one (malformed JSON, a Redis URL with a bad port,
Redis down, a broker down or refusing the password, the outbox database down, an unknown
id, a queue that does not exist) and every command that takes that input is run with it
against real brokers and a real Redis: none may show a traceback or an "unexpected" error,
and each must exit nonzero.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pika
import pytest
from click.testing import CliRunner

from celery_beetle.cli import main
from celery_beetle.testing.rabbit import RabbitNode
from celery_beetle.worker.deadletter import dead_letter_headers

pytestmark = pytest.mark.integration

#: flags that keep a command from changing anything or from running until stopped
_SAFE_FLAGS = {"dry_run", "once"}
#: the environment the commands would otherwise read their URLs from
_CLEAN_ENV: dict[str, str | None] = {
    name: None
    for name in (
        "BEETLE_BROKER_URL",
        "BEETLE_BROKER_URL_FILE",
        "BEETLE_REDIS_URL",
        "BEETLE_REDIS_URL_FILE",
        "BEETLE_OUTBOX_DB",
        "BEETLE_TRACE_DIR",
        "BEETLE_DEBUG",
    )
}


def leaf_commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command under ``group`` that runs something (not a group)."""
    for name in sorted(group.list_commands(click.Context(group))):
        command = group.get_command(click.Context(group), name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name)


def command_at(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), name)
        assert found is not None
        command = found
    return command


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def arguments(command: click.Command, values: dict[str, Any]) -> list[str]:
    """The command line that gives ``command`` each of its parameters found in ``values``."""
    args: list[str] = []
    for param in command.params:
        if isinstance(param, click.Option) and param.is_flag:
            if param.name in _SAFE_FLAGS:
                args.append(param.opts[0])
            continue
        value = values.get(param.name or "")
        if value is None:
            continue
        for item in [value] if isinstance(value, str) else value:
            args += [item] if isinstance(param, click.Argument) else [param.opts[0], item]
    return args


def dead_letter(brokers: Any, queue: str, message_id: str) -> None:
    """A dead letter as the worker writes it, a copy on every broker; the queue declared."""
    headers = dead_letter_headers("not_retryable", queue, now_ms=1_000_000, worker="w1")
    properties = pika.BasicProperties(
        message_id=message_id, headers={"task": "t.a", **headers}, delivery_mode=2
    )
    for node in brokers.nodes:
        conn = node.connect(brokers.vhost)
        try:
            channel = conn.channel()
            channel.queue_declare(queue, durable=True)
            channel.queue_declare(f"{queue}.dead", durable=True)
            channel.basic_publish("", f"{queue}.dead", b"[[1], {}, {}]", properties)
        finally:
            conn.close()


@pytest.fixture
def good(brokers: Any, redis_url: str, tmp_path: Path) -> dict[str, Any]:
    """Inputs that work: real brokers with one dead letter, a real Redis, a valid config."""
    dead_letter(brokers, "jobs", "8ada1f00-0000-4000-8000-000000000001")
    config = tmp_path / "policies.json"
    config.write_text('{"queues": {"jobs": {"max_length": 1000}}}')
    return {
        "broker_url": brokers.beetle_url,
        "redis_url": redis_url,
        "db_url": f"postgresql://beetle@127.0.0.1:{free_port()}/beetle",
        "config_path": str(config),
        "queue": "jobs",
        "positionals": ["8ada1f00"],
        "ids": ["nosuchid"],
        "names": "jobs",
        "task": "t.a",
        "queue_type": "quorum",
        "management_urls": [
            f"{node.host_port}=http://{node.host}:{node.management_port}" for node in brokers.nodes
        ],
        "trace_path": [str(tmp_path / "no-trace")],
        "out_dir": str(tmp_path / "out"),
    }


def _bad_json(tmp_path: Path) -> str:
    path = tmp_path / "bad.json"
    path.write_text('{"queues": {"jobs": ')
    return str(path)


#: scenario -> (the parameter it spoils, how to spoil it from (good inputs, tmp_path))
SCENARIOS: dict[str, tuple[str, Any]] = {
    "malformed JSON config": ("config_path", lambda good, tmp: _bad_json(tmp)),
    "config file missing": ("config_path", lambda good, tmp: str(tmp / "missing.json")),
    "Redis URL with a bad port": ("redis_url", lambda good, tmp: "redis://127.0.0.1:99999/0"),
    "Redis down": ("redis_url", lambda good, tmp: f"redis://127.0.0.1:{free_port()}/0"),
    "broker down": ("broker_url", lambda good, tmp: f"beetle://127.0.0.1:{free_port()}/"),
    "wrong broker password": (
        "broker_url",
        lambda good, tmp: good["broker_url"].replace(f":{RabbitNode.password}@", ":wrong@"),
    ),
    "database down": ("db_url", lambda good, tmp: good["db_url"]),
    "unknown id": ("positionals", lambda good, tmp: ["nosuchid"]),
    "unknown outbox id": ("ids", lambda good, tmp: ["nosuchid"]),
    "missing queue": ("queue", lambda good, tmp: "nosuchqueue"),
    "missing trace": ("trace_path", lambda good, tmp: [str(tmp / "nowhere")]),
}


def test_the_walk_finds_every_command_of_the_group():
    found = set(leaf_commands(main))
    assert {("dead-letters", "replay"), ("queues", "migrate"), ("outbox", "drop")} <= found
    assert ("fleet",) in found and ("status",) in found and ("audit",) in found
    assert not any(path[0] == "dead" for path in found)  # the alias is not walked twice


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_no_command_shows_a_traceback_for_bad_input(scenario, good, tmp_path):
    spoiled, spoil = SCENARIOS[scenario]
    values = {**good, spoiled: spoil(good, tmp_path)}
    ran = []
    for path in leaf_commands(main):
        command = command_at(path)
        if spoiled not in {param.name for param in command.params}:
            continue
        args = [*path, *arguments(command, values)]
        result = CliRunner().invoke(main, args, env=_CLEAN_ENV, input="n\n")
        shown = f"beetle {' '.join(args)}\n{result.output}"
        assert not isinstance(result.exception, Exception) or isinstance(
            result.exception, SystemExit
        ), f"{shown}\n{result.exception!r}"
        assert "Traceback" not in result.output, shown
        assert "unexpected" not in result.output, shown
        assert result.exit_code in (1, 2), shown
        ran.append(" ".join(path))
    assert ran, f"no command takes {spoiled}"
