"""Errors raised by the beetle transport.

They subclass kombu's so that Celery's and kombu's retry policies apply to them
unchanged: ``NoBrokerAvailable`` is a recoverable connection error, so a publish
with ``retry=True`` waits for a broker instead of failing at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from kombu.exceptions import OperationalError

from .urls import mask_url

EXPECTED_URL_FORM = "beetle://USER:PASSWORD@HOST1:PORT1,HOST2:PORT2[,...]/VHOST?option=value"


class InvalidBrokerURL(ValueError):
    """A ``beetle://`` URL that cannot be parsed; the message shows the expected form.

    The URL is kept and shown with its password masked: this error ends up in logs
    and tracebacks, and a typo in a host must not publish the broker's password.
    """

    def __init__(self, url: str, problem: str) -> None:
        self.url = mask_url(url)
        self.problem = problem
        super().__init__(
            f"invalid beetle URL {self.url!r}: {problem}; expected {EXPECTED_URL_FORM}"
        )


class InvalidTransportOption(ValueError):
    """A transport option (URL query or ``broker_transport_options``) with a bad value."""


class NoBrokerAvailable(OperationalError):
    """Every broker of the URL is down: nothing could be published or declared."""

    def __init__(self, tried: Iterable[str], reason: str = "") -> None:
        self.tried = tuple(tried)
        detail = f": {reason}" if reason else ""
        super().__init__(
            f"no RabbitMQ broker available (tried {', '.join(self.tried) or 'none'}){detail}"
        )


class PublishNotConfirmed(OperationalError):
    """No broker confirmed a publish within the confirm timeout (or every one nacked it)."""
