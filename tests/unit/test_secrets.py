"""No password in an error, a repr, Celery's configuration reports or ``beetle status``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from celery import Celery
from celery.app.utils import filter_hidden_settings
from click.testing import CliRunner

import celery_beetle
from celery_beetle.cli import main
from celery_beetle.settings import BeetleSettings, mask_url, parse_store_url
from kombu_beetle.errors import InvalidBrokerURL
from kombu_beetle.options import build_options

SECRET = "Tr0ub4dor-s3cret"


@pytest.mark.parametrize(
    "url",
    [
        f"beetle://bob:{SECRET}@h1:notaport,h2",
        f"beetle://bob:{SECRET}@h1,h1/v",
        f"amqp://bob:{SECRET}@h1",
        f"beetle://bob:{SECRET}@h1,h2/v?no_such_option=1",
    ],
)
def test_an_invalid_broker_url_error_shows_the_url_without_its_password(url):
    with pytest.raises(InvalidBrokerURL) as caught:
        build_options(url)
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    assert "bob:***@" in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        f"redis+sentinel://h1,h2/mymaster?sentinel_password={SECRET}",
        f"redis+sentinel://:{SECRET}@h1/mymaster?password={SECRET}",
        f"unix:///tmp/redis.sock?password={SECRET}",
    ],
)
def test_settings_mask_url_hides_password_query_values(url):
    assert SECRET not in mask_url(url)


def test_a_bad_store_url_error_and_the_settings_repr_hide_the_password():
    with pytest.raises(ValueError) as caught:
        parse_store_url(f"redis+sentinel://:{SECRET}@h1/m?sentinel_password={SECRET}&bad=1")
    assert SECRET not in str(caught.value)
    settings = BeetleSettings(redis_url=f"redis://:{SECRET}@h:6379/0")
    assert SECRET not in repr(settings)


def test_celery_reports_censor_the_store_url_once_installed():
    app = Celery(broker=f"beetle://bob:{SECRET}@h1,h2/v", set_as_current=False)
    app.conf.beetle_redis_url = f"redis://:{SECRET}@redis.example:6379/0"
    celery_beetle.install(app)
    report = app.conf.humanize(with_defaults=False, censored=True)
    assert SECRET not in report
    assert "beetle_redis_url: '********'" in report
    hidden = filter_hidden_settings({"beetle_redis_url": app.conf.beetle_redis_url})
    assert hidden == {"beetle_redis_url": "********"}
    assert SECRET not in str(app.conf.table(with_defaults=False, censored=True))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_status_reads_both_urls_from_files_and_prints_no_password(tmp_path: Path):
    broker_file = tmp_path / "broker-url"
    broker_file.write_text(f"beetle://bob:{SECRET}@127.0.0.1:{_closed_port()}/\n")
    redis_file = tmp_path / "redis-url"
    redis_file.write_text(f"redis://:{SECRET}@127.0.0.1:{_closed_port()}/0")
    result = CliRunner().invoke(
        main,
        ["status", "--broker-url-file", str(broker_file)],
        env={"BEETLE_REDIS_URL_FILE": str(redis_file)},
        terminal_width=200,
    )
    assert result.exit_code == 1, result.output
    assert "down" in result.output and "dedup store redis://:***@127.0.0.1" in result.output
    assert SECRET not in result.output


def test_status_refuses_a_url_and_a_file_together_and_a_missing_file(tmp_path: Path):
    runner = CliRunner()
    (tmp_path / "url").write_text("beetle://h")
    both = runner.invoke(
        main, ["status", "-b", "beetle://h", "--broker-url-file", str(tmp_path / "url")]
    )
    assert both.exit_code == 2 and "not both" in both.output
    missing = runner.invoke(main, ["status", "--broker-url-file", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "cannot read the broker URL" in missing.output
    none = runner.invoke(main, ["status"], env={"BEETLE_BROKER_URL": ""})
    assert none.exit_code == 2 and "BEETLE_BROKER_URL_FILE" in none.output


def test_status_help_warns_that_a_url_argument_is_visible_to_ps():
    result = CliRunner().invoke(main, ["status", "--help"], terminal_width=200)
    assert "visible to every user of the machine through ps" in " ".join(result.output.split())
