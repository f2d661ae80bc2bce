"""The click options and helpers the ops wing's commands share (:mod:`.cli`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import click

__all__ = [
    "broker_option",
    "fail_on_bad_url",
    "json_option",
    "prefix_option",
    "redis_option",
    "report_errors",
    "when",
]

broker_option = click.option(
    "--broker",
    "-b",
    "broker_url",
    envvar="BEETLE_BROKER_URL",
    required=True,
    help="The beetle:// URL of the brokers (or $BEETLE_BROKER_URL).",
)
redis_option = click.option(
    "--redis",
    "redis_url",
    envvar="BEETLE_REDIS_URL",
    required=True,
    help="The dedup store's URL (or $BEETLE_REDIS_URL).",
)
prefix_option = click.option(
    "--key-prefix", default="beetle:", show_default=True, help="beetle_key_prefix of the workers."
)
json_option = click.option("--json", "as_json", is_flag=True, help="JSON for scripts.")


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def fail_on_bad_url(call: Callable[[], Any]) -> Any:
    from kombu_beetle.errors import InvalidBrokerURL, InvalidTransportOption

    try:
        return call()
    except (InvalidBrokerURL, InvalidTransportOption) as exc:
        raise click.BadParameter(str(exc), param_hint="--broker")


def report_errors(errors: dict[str, str]) -> None:
    for broker, error in errors.items():
        click.echo(f"broker {broker} could not be read: {error}", err=True)
