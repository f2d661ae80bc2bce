"""The click options and helpers the ops wing's commands share (:mod:`.cli`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import click

__all__ = [
    "HiddenArgument",
    "broker_option",
    "check_redis_url",
    "chosen_queue",
    "fail_on_bad_url",
    "json_option",
    "prefix_option",
    "queue_option",
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


def check_redis_url(ctx: click.Context | None, param: Any, url: str | None) -> str | None:
    """A click callback: a store URL that cannot be right is a usage error naming what is
    wrong, before anything connects (:func:`celery_beetle.store.address.parse_store_url`)."""
    from celery_beetle.store.address import parse_store_url

    if url is None:
        return None
    try:
        parse_store_url(url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return url


redis_option = click.option(
    "--redis",
    "redis_url",
    envvar="BEETLE_REDIS_URL",
    required=True,
    callback=check_redis_url,
    help="The dedup store's URL (or $BEETLE_REDIS_URL).",
)
queue_option = click.option(
    "--queue",
    "-Q",
    "queue",
    default=None,
    metavar="QUEUE",
    help="The queue (the name the workers consume).",
)


class HiddenArgument(click.Argument):
    """A positional argument kept for an old spelling: it works, but usage does not show it."""

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return []


def chosen_queue(
    queue: str | None, positionals: tuple[str, ...], spelling: str
) -> tuple[str, tuple[str, ...]]:
    """``(queue, the remaining positionals)``: the queue of ``-Q``, or, in the old spelling
    where ``-Q`` is absent, the first positional, with a deprecation warning on stderr."""
    if queue is not None:
        return queue, positionals
    if not positionals:
        raise click.UsageError("name the queue: -Q QUEUE (e.g. -Q celery)")
    click.echo(
        f"warning: the queue as the first argument ({spelling}) is deprecated and will be "
        f"refused in the next release: write -Q {positionals[0]}",
        err=True,
    )
    return positionals[0], positionals[1:]


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
