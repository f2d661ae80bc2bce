"""Errors raised by the beetle transport.

Broker trouble subclasses kombu's errors so that Celery's and kombu's retry
policies apply to it unchanged: ``NoBrokerAvailable`` is a recoverable
connection error, so a publish with ``retry=True`` waits for a broker instead
of failing at once.  Bad input (a URL, an option, a message too large) is a
``ValueError``: retrying it could never succeed.
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


class BrokerTLSError(OperationalError):
    """The TLS handshake with one broker failed: a certificate that does not verify (wrong
    host name, unknown CA, expired), or a port that does not speak TLS.

    A kombu ``OperationalError``, like any broker being down: the other brokers carry on
    and this one is tried again with backoff (a renewed certificate fixes it without a
    restart). The message names the broker and what to check.
    """

    def __init__(self, broker: str, reason: BaseException) -> None:
        self.broker = broker
        self.reason = reason
        detail = getattr(reason, "verify_message", None) or getattr(reason, "reason", None)
        detail = str(detail or reason).rstrip(".")
        super().__init__(
            f"TLS to broker {broker} failed: {detail}. Check that {broker} is a TLS "
            f"port (RabbitMQ's listeners.ssl, 5671 by default) and that its certificate names "
            f"the host written in the URL and is signed by a CA in ssl's ca_certs (or set "
            f"ssl options for this broker in broker_options)"
        )


class PublishNotConfirmed(OperationalError):
    """No broker confirmed a publish within the confirm timeout (or every one nacked it)."""


class MessageTooLarge(ValueError):
    """A publish whose body is over ``max_message_bytes``, refused before it was sent.

    A ``ValueError`` and not a kombu ``OperationalError``: Celery's publish retry must
    not send it again (it would be just as large), and no broker is blamed for it.
    """

    def __init__(
        self, size: int, limit: int, message_id: str | None, exchange: str, routing_key: str
    ) -> None:
        self.size = size
        self.limit = limit
        self.message_id = message_id
        self.routing_key = routing_key
        super().__init__(
            f"message {message_id or '(no message_id)'} to exchange {exchange!r} with routing "
            f"key {routing_key!r} has a {size}-byte body, over the {limit}-byte limit; nothing "
            f"was sent. Send a smaller body (a reference to the data), or raise the transport "
            f"option max_message_bytes (and RabbitMQ's max_message_size with it)"
        )


class UnencodableMessage(ValueError):
    """A message whose properties or headers AMQP cannot carry (a priority that is not a
    number, an integer over 64 bits, a header of a type AMQP tables lack), refused by
    :meth:`~kombu_beetle.publish.Publisher.publish_many` before anything is written.

    Found while serializing the properties that are then written as they are, so checking
    costs nothing extra; ``reason`` is the serializer's own error, and the text is
    ``"<its type>: <it>"``.
    """

    def __init__(self, message_id: str | None, reason: BaseException) -> None:
        self.message_id = message_id
        self.reason = reason
        super().__init__(f"{type(reason).__name__}: {reason}")
