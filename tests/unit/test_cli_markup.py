"""Text from outside (URLs, error messages, queue names, labels, paths) is printed as written.

rich reads ``[...]`` as markup: ``[/db]`` in an error message stopped ``beetle status`` with a
MarkupError, and ``[bold]`` in a queue name would have changed the output. Every command
printing through rich is fed such text here, and must show it literally.
"""

from __future__ import annotations

import io
import socket

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from celery_beetle.audit.cli import _Display, _print_verdict
from celery_beetle.cli import main, report, top

#: closes a tag rich never opened (a MarkupError), and opens one it knows (a style)
ODD = "x[/db]y[bold]z"
WIDE = {"COLUMNS": "400"}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _assert_printed_literally(result: Result, *texts: str) -> None:
    assert not isinstance(result.exception, Exception), repr(result.exception)
    for text in texts:
        assert text in result.output, result.output


def test_status_refuses_a_malformed_store_url_with_its_form_and_without_its_password():
    result = CliRunner().invoke(
        main,
        ["status", "--broker", f"beetle://127.0.0.1:{_closed_port()}/"],
        env={**WIDE, "BEETLE_REDIS_URL": "redis://:pw@127.0.0.1:63x6/0"},
    )
    assert result.exit_code == 2
    _assert_printed_literally(result, "host[:port][/db]", "--redis", "'63x6'")
    assert ":pw@" not in result.output


def test_status_shows_broker_names_errors_versions_queues_and_the_store_as_written(monkeypatch):
    def brokers(url, queues):
        return [
            report.BrokerStatus(f"down{ODD}", up=False, error=f"OSError: {ODD}"),
            report.BrokerStatus(f"up{ODD}", up=True, version=f"v{ODD}", queues={ODD: (3, 1)}),
        ]

    monkeypatch.setattr(report, "brokers", brokers)
    monkeypatch.setattr(
        report, "store", lambda url: report.StoreStatus(f"redis://{ODD}", up=False, error=ODD)
    )
    result = CliRunner().invoke(
        main, ["status", "-b", "beetle://h1,h2/", "--redis", "redis://h", "-Q", ODD], env=WIDE
    )
    assert result.exit_code == 1
    _assert_printed_literally(
        result,
        f"down{ODD}",
        f"OSError: {ODD}",
        f"up{ODD}",
        f"v{ODD}",
        f"{ODD} ready/consumers",
        f"dedup store redis://{ODD}: down {ODD}",
    )


def test_status_shows_an_up_store_as_written(monkeypatch):
    monkeypatch.setattr(report, "brokers", lambda url, queues: [])
    up = report.StoreStatus(f"redis://{ODD}", up=True, latency_ms=1.0, keys=2, used_memory=ODD)
    monkeypatch.setattr(report, "store", lambda url: up)
    result = CliRunner().invoke(
        main, ["status", "-b", "beetle://h1,h2/", "--redis", "redis://r"], env=WIDE
    )
    _assert_printed_literally(result, f"dedup store redis://{ODD}: up", f"2 keys, {ODD}")


def _render(renderable: object) -> str:
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_the_live_view_shows_brokers_queues_the_store_and_metric_labels_as_written():
    def sample(name: str, label: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (name, ((label, ODD),))

    now = top.Snapshot(
        at=1.0,
        brokers=[report.BrokerStatus(f"b{ODD}", up=False, error=f"E {ODD}", queues={ODD: None})],
        store=report.StoreStatus(f"redis://{ODD}", up=False, error=f"S {ODD}"),
        samples={
            sample("beetle_gate_deliveries_total", "verdict"): 4.0,
            sample("beetle_dead_letters_total", "queue"): 2.0,
        },
        unreachable=[f"http://m/{ODD}: URLError"],
    )
    text = _render(top.view(now, None, [ODD]))
    for shown in (f"b{ODD}", f"E {ODD}", f"{ODD} ready/consumers", f"redis://{ODD}: down S {ODD}"):
        assert shown in text, text
    assert text.count(ODD) >= 8, text  # and the verdict and dead-letter queue labels


def test_dead_letters_list_shows_the_queue_name_as_written(monkeypatch):
    from celery_beetle.ops import dead_letters

    monkeypatch.setattr(dead_letters, "list_dead_letters", lambda url, queue: ([], {}))
    result = CliRunner().invoke(
        main, ["dead-letters", "list", "-Q", ODD, "--broker", "beetle://h1,h2/"], env=WIDE
    )
    assert result.exit_code == 0
    _assert_printed_literally(result, f"{ODD}.dead: 0 dead letter(s)")


def test_the_audit_verdict_shows_its_file_paths_as_written(capsys: pytest.CaptureFixture[str]):
    from celery_beetle.audit.verdicts import SUMMARY_COUNTS

    files = {"summary": f"out{ODD}/summary.json", "report": f"out{ODD}/report.html"}
    _print_verdict(dict.fromkeys(SUMMARY_COUNTS, 0), files, rich_output=True)
    printed = capsys.readouterr().out
    assert files["summary"] in printed and files["report"] in printed


def test_the_audit_progress_line_shows_a_step_as_written():
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    with console.status("starting") as status:
        display = _Display(status, console)
        display.step(f"reading {ODD}")
        display.tasks(None)
    assert f"reading {ODD}" in console.file.getvalue()  # type: ignore[attr-defined]
