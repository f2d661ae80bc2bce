"""What an operator sees when a command fails: one line naming the input and what to do.

:func:`guard_commands` wraps every command of the ``beetle`` group once it is assembled, so
that no command shows a traceback for a server that does not answer or an input that does
not fit. The exit status follows click's convention: 2 for bad input (a usage error, a bad
value, an id or a queue that is not there), 1 for a failure of a server (Redis, a broker,
the management API, the outbox database). An error nobody foresaw is one line too, naming
its type; ``BEETLE_DEBUG=1`` shows its traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import click

__all__ = ["guard_commands", "translate"]

#: the parameter that holds each server's URL, and how the operator sets it
_SERVERS = {
    "redis_url": ("the dedup store (Redis)", "--redis or $BEETLE_REDIS_URL"),
    "db_url": ("the outbox database", "--db or $BEETLE_OUTBOX_DB"),
    "broker_url": ("the brokers", "--broker or $BEETLE_BROKER_URL"),
}


def _masked(url: Any) -> str:
    from celery_beetle.settings import mask_url

    try:
        return mask_url(str(url))
    except Exception:  # a URL too broken to mask is not shown at all
        return "(the URL given)"


def _server(params: Mapping[str, Any], key: str, problem: str, hint: str) -> click.ClickException:
    what, where = _SERVERS[key]
    url = params.get(key)
    at = f" at {_masked(url)}" if url else ""
    return click.ClickException(f"cannot reach {what}{at}: {problem}; {hint} (set by {where})")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__


def translate(exc: Exception, params: Mapping[str, Any]) -> click.ClickException | None:
    """The click error to show for ``exc``, raised by a command called with ``params``;
    None for an error nobody foresaw. Modules not yet imported are not imported here."""
    from celery_beetle.ops.dead_letters import DeadLetterNotFound, NoBrokerReadable, QueueNotFound

    if isinstance(exc, (DeadLetterNotFound, QueueNotFound)):
        return click.UsageError(str(exc))
    if isinstance(exc, NoBrokerReadable):
        return click.ClickException(
            f"{exc}; check that the brokers are up and the user and password in the "
            "beetle:// URL (--broker or $BEETLE_BROKER_URL)"
        )
    kombu_errors = sys.modules.get("kombu_beetle.errors")
    if kombu_errors is not None and isinstance(
        exc, (kombu_errors.InvalidBrokerURL, kombu_errors.InvalidTransportOption)
    ):
        return click.BadParameter(str(exc), param_hint="--broker")
    kombu = sys.modules.get("kombu.exceptions")
    if kombu is not None and isinstance(exc, kombu.OperationalError):
        return _server(
            params, "broker_url", _one_line(exc), "are the brokers up, the user and password right?"
        )
    redis = sys.modules.get("redis.exceptions")
    if redis is not None and isinstance(exc, redis.AuthenticationError):
        return _server(params, "redis_url", _one_line(exc), "check the password in the URL")
    if redis is not None and isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return _server(params, "redis_url", _one_line(exc), "is Redis up and the URL right?")
    sqlalchemy = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy is not None and isinstance(exc, sqlalchemy.OperationalError):
        return _server(
            params, "db_url", _one_line(exc.orig or exc), "is the database up and the URL right?"
        )
    if sqlalchemy is not None and isinstance(exc, sqlalchemy.ProgrammingError):
        return click.ClickException(
            f"the outbox database answered: {_one_line(exc.orig or exc)}; "
            "have its tables been created (beetle outbox init)?"
        )
    management = sys.modules.get("celery_beetle.ops.management")
    if management is not None and isinstance(exc, management.ManagementError):
        return click.ClickException(
            f"the RabbitMQ management API failed: {exc}; is the management plugin enabled "
            "and reachable (--management-port, --management-url)?"
        )
    amqp = sys.modules.get("amqp.exceptions")
    if amqp is not None and isinstance(exc, amqp.AccessRefused):
        return _server(params, "broker_url", _one_line(exc), "check the user and password")
    if isinstance(exc, OSError) and "broker_url" in params:
        return _server(params, "broker_url", _one_line(exc), "are the brokers up?")
    return None


def _guarded(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def run(*args: Any, **params: Any) -> Any:
        try:
            return callback(*args, **params)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            raise click.Abort() from None
        except Exception as exc:
            if os.environ.get("BEETLE_DEBUG"):
                raise
            error = translate(exc, params)
            if error is None:
                error = click.ClickException(
                    f"unexpected {type(exc).__module__}.{type(exc).__name__}: "
                    f"{_one_line(exc)} (BEETLE_DEBUG=1 shows where; please report it)"
                )
            raise error from None

    return run


def guard_commands(command: click.Command) -> None:
    """Wrap the callback of ``command`` and of every command under it (once)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            guard_commands(sub)
    if command.callback is not None and not getattr(command.callback, "_beetle_guarded", False):
        command.callback = _guarded(command.callback)
        command.callback._beetle_guarded = True  # type: ignore[attr-defined]
