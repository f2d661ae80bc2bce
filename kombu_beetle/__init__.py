"""kombu_beetle: one kombu transport over N independent RabbitMQ brokers.

Importing this package registers the ``beetle`` transport alias with kombu
(kombu has no entry points for transports), so that
``Connection("beetle://guest:guest@h1:5672,h2:5672//")`` and Celery's
``broker_url = "beetle://..."`` find :class:`kombu_beetle.Transport`.
See :mod:`kombu_beetle.transport` for the URL form and the options.

The transport stands alone: it knows nothing of the worker side, which builds on it
(``tests/unit/test_import_rules.py`` checks):

:May import: ``kombu_beetle`` (itself; nothing of celery_beetle)
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from .envelope import (
    EXPIRES_AT_HEADER,
    FLAG_DEGRADED,
    FLAG_REDUNDANT,
    FLAGS_HEADER,
    FORMAT_HEADER,
    PUBLISHED_AT_HEADER,
)
from .errors import (
    BrokerTLSError,
    InvalidBrokerURL,
    InvalidTransportOption,
    MessageTooLarge,
    NoBrokerAvailable,
)
from .options import BeetleOptions, build_options, parse_url
from .transport import Transport

TRANSPORT_ALIASES.setdefault("beetle", "kombu_beetle.transport:Transport")

__all__ = [
    "EXPIRES_AT_HEADER",
    "FLAGS_HEADER",
    "FLAG_DEGRADED",
    "FLAG_REDUNDANT",
    "FORMAT_HEADER",
    "PUBLISHED_AT_HEADER",
    "BeetleOptions",
    "BrokerTLSError",
    "InvalidBrokerURL",
    "InvalidTransportOption",
    "MessageTooLarge",
    "NoBrokerAvailable",
    "Transport",
    "build_options",
    "parse_url",
]
