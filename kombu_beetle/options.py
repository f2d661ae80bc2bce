"""Parsing of ``beetle://`` URLs and transport options into one typed value.

Options come from the URL query (``?publish_strategy=primary``) and from
``broker_transport_options``; the transport options win where both set one.
Options the transport does not know are handed to py-amqp's ``Connection``
(``read_timeout``, ``socket_settings``, ...), as the pyamqp transport does.

``max_message_bytes`` (default 16 MiB, RabbitMQ 4.0's ``max_message_size``) caps
a message's body: a larger publish is refused before any byte is written, with
:class:`~kombu_beetle.errors.MessageTooLarge`.  Without a cap, a body too big to
write within the socket timeout makes a healthy broker look dead; RabbitMQ 3.x
never tells a client its own limit, so the transport keeps one of its own.

TLS (``ssl``): ``?ssl=1`` in the URL, ``ssl`` in ``broker_transport_options`` or Celery's
``broker_use_ssl`` (``True``, or py-amqp's dict of ``ca_certs``, ``certfile``, ``keyfile``,
``cert_reqs``, ...), and per broker ``broker_options={"host:port": {"ssl": {...}}}``. With
TLS a broker without a port gets 5671, and each broker's certificate is checked against that
broker's own host name (:meth:`BeetleOptions.ssl_for`): ``server_hostname`` defaults to the
host written in the URL. Verification is off only when asked for (``cert_reqs=CERT_NONE``).

``dedup_scopes`` (a dict, or ``"q1=s1,q2=s2"`` in the URL) maps queues to the dedup scope
workers deduplicate them under (``kombu_beetle.scopes``); publishers name that scope in
their trace events, so the audit matches them with the workers' events.
``celery_beetle.install(app)`` sets it from ``beetle_dedup_scopes``.
"""

from __future__ import annotations

import ssl as _ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import InvalidBrokerURL, InvalidTransportOption
from .scopes import parse_dedup_scopes
from .urls import parse_host_port

DEFAULT_PORT = 5672
DEFAULT_SSL_PORT = 5671
PUBLISH_STRATEGIES = ("round_robin", "primary")
#: RabbitMQ 4.0's default ``max_message_size``: 16 MiB
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

#: py-amqp ``Connection`` keyword arguments that may pass through unchanged.
AMQP_CONNECTION_OPTIONS = frozenset(
    {
        "read_timeout",
        "write_timeout",
        "socket_settings",
        "client_properties",
        "channel_max",
        "frame_max",
        "locale",
        "login_method",
        "login_response",
        "authentication",
    }
)

#: Options of other transports or of kombu/Celery retry policies that Celery users
#: commonly keep in ``broker_transport_options``, and those ``kombu.Connection`` reads there
#: for its own connection retries (``connect_retries_timeout``, ``errback``, ``callback``);
#: accepted and ignored by the transport.
IGNORED_OPTIONS = frozenset(
    {
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
        "connect_retries_timeout",
        "errback",
        "callback",
        "visibility_timeout",
        "polling_interval",
        "priority_steps",
        "confirm_timeout_s",
    }
)


@dataclass(frozen=True)
class BrokerAddress:
    """One broker of the URL; its ``name`` is ``host:port``."""

    host: str
    port: int

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class BeetleOptions:
    """Everything the transport needs to know, with units in the names."""

    brokers: tuple[BrokerAddress, ...]
    userid: str = "guest"
    password: str = "guest"
    virtual_host: str = "/"
    ssl: Any = False
    #: copies of a redundant message (two distinct brokers)
    redundancy: int = 2
    publish_strategy: str = "round_robin"
    confirm_publish: bool = True
    confirm_timeout_s: float = 5.0
    connect_timeout_s: float = 4.0
    heartbeat_s: float = 0
    #: first and longest wait before a dead broker is tried again
    reconnect_interval_s: float = 1.0
    reconnect_max_interval_s: float = 30.0
    #: routing keys (queue names) whose messages are always published redundantly
    redundant_queues: frozenset[str] = frozenset()
    #: default lifetime of a redundant message (``x-beetle-expires-at``)
    message_ttl_s: float = 86400.0
    #: largest body a publish may carry; a larger one raises MessageTooLarge, unsent
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: consume-only brokers, for draining an old broker while a fleet moves
    additional_subscription_brokers: tuple[BrokerAddress, ...] = ()
    trace_dir: str | None = None
    #: ``{queue: dedup scope}`` (``kombu_beetle.scopes``): the ``queue`` of ``published``
    #: trace events
    dedup_scopes: Mapping[str, str] = field(default_factory=dict)
    #: extra py-amqp Connection keyword arguments, and per-broker overrides by "host:port"
    amqp_options: Mapping[str, Any] = field(default_factory=dict)
    broker_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __repr__(self) -> str:
        brokers = ",".join(b.name for b in self.brokers)
        return (
            f"BeetleOptions(brokers={brokers}, userid={self.userid!r}, password='**', "
            f"virtual_host={self.virtual_host!r}, redundancy={self.redundancy}, "
            f"publish_strategy={self.publish_strategy!r}, confirm_publish={self.confirm_publish})"
        )

    def ssl_for(self, broker: BrokerAddress) -> Any:
        """py-amqp's ``ssl`` argument for ``broker``: False, or options that verify its name.

        The broker's own ``broker_options`` ``ssl`` wins over the shared one. Unless the
        options name a ``server_hostname`` or turn verification off (``cert_reqs=CERT_NONE``),
        the broker's host from the URL is the name its certificate must carry: py-amqp
        checks the certificate's chain but not its name when no ``server_hostname`` is given,
        so any certificate of the CA would pass for every broker.
        """
        tls = self.broker_options.get(broker.name, {}).get("ssl", self.ssl)
        if not tls:
            return False
        tls_options: dict[str, Any] = {} if tls is True else dict(tls)
        if "context" in tls_options:  # py-amqp's create_default_context() form
            context = dict(tls_options["context"])
            context.setdefault("check_hostname", True)
            tls_options["context"] = context
        if tls_options.get("cert_reqs", _ssl.CERT_REQUIRED) != _ssl.CERT_NONE:
            tls_options.setdefault("server_hostname", broker.host)
        return tls_options or True

    @property
    def all_brokers(self) -> tuple[BrokerAddress, ...]:
        return self.brokers + tuple(
            b for b in self.additional_subscription_brokers if b not in self.brokers
        )


@dataclass(frozen=True)
class ParsedURL:
    """The parts of a ``beetle://`` URL, before the options are checked."""

    brokers: tuple[BrokerAddress, ...]
    userid: str | None
    password: str | None
    virtual_host: str
    query: dict[str, str]


def parse_url(url: str, default_port: int = DEFAULT_PORT) -> ParsedURL:
    """Split ``beetle://USER:PASS@H1:P1,H2:P2/VHOST?opt=v``; raise InvalidBrokerURL if malformed."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidBrokerURL(str(url), "missing the 'beetle://' scheme")
    scheme, rest = url.split("://", 1)
    if scheme != "beetle":
        raise InvalidBrokerURL(url, f"scheme must be 'beetle', not {scheme!r}")
    if ";" in rest:
        raise InvalidBrokerURL(url, "separate brokers with ',' inside one URL, not ';'")
    try:
        parts = urlsplit("//" + rest)
    except ValueError as exc:
        raise InvalidBrokerURL(url, str(exc)) from None
    netloc = parts.netloc
    userid = password = None
    if "@" in netloc:
        userinfo, hostlist = netloc.rsplit("@", 1)
        if ":" in userinfo:
            user_raw, pass_raw = userinfo.split(":", 1)
            password = unquote(pass_raw)
        else:
            user_raw = userinfo
        userid = unquote(user_raw) or None
    else:
        hostlist = netloc
    brokers = _parse_hosts(url, hostlist, default_port)
    path = parts.path
    if path in ("", "/"):
        vhost = "/"
    else:
        raw_vhost = path[1:]
        if "/" in raw_vhost and raw_vhost != "/":
            raise InvalidBrokerURL(url, f"the vhost {raw_vhost!r} contains '/' (write it as %2F)")
        vhost = unquote(raw_vhost)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    return ParsedURL(brokers, userid, password, vhost, query)


def _parse_hosts(url: str, hostlist: str, default_port: int) -> tuple[BrokerAddress, ...]:
    if not hostlist.strip():
        return (BrokerAddress("127.0.0.1", default_port),)
    brokers: list[BrokerAddress] = []
    for index, item in enumerate(hostlist.split(","), start=1):
        item = item.strip()
        if not item:
            raise InvalidBrokerURL(url, f"broker {index} is empty (a stray ',')")
        try:
            host, port = parse_host_port(item, default_port)
        except ValueError as exc:
            raise InvalidBrokerURL(url, f"broker {index}: {exc}") from None
        if host == "localhost":
            host = "127.0.0.1"
        address = BrokerAddress(host, port)
        if address in brokers:
            raise InvalidBrokerURL(url, f"broker {address.name} is listed twice")
        brokers.append(address)
    return tuple(brokers)


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise InvalidTransportOption(f"transport option {name}={value!r} must be a boolean (1/0)")


def _as_ssl(value: Any) -> Any:
    """``ssl``: a flag (``1``/``0`` in a URL) or py-amqp's dict of TLS options, as given."""
    if isinstance(value, (str, bool)):
        return _as_bool("ssl", value) if value != "" else False
    return value or False


def _as_number(name: str, value: Any, minimum: float = 0.0) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidTransportOption(f"transport option {name}={value!r} must be a number")
    if number < minimum:
        raise InvalidTransportOption(f"transport option {name}={value!r} must be >= {minimum}")
    return number


def _as_positive_int(name: str, value: Any) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise InvalidTransportOption(
            f"transport option {name}={value!r} must be a whole number of bytes >= 1"
        )
    return int(text)


def _as_names(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(v.strip() for v in value.split(",") if v.strip())
    return frozenset(str(v) for v in value)


def _as_scopes(name: str, value: Any) -> dict[str, str]:
    try:
        return parse_dedup_scopes(value)
    except ValueError as exc:
        raise InvalidTransportOption(f"transport option {name}: {exc}") from None


def _as_brokers(url: str, value: Any, default_port: int) -> tuple[BrokerAddress, ...]:
    text = value if isinstance(value, str) else ",".join(str(v) for v in value)
    return _parse_hosts(url, text, default_port) if text.strip() else ()


#: option name -> (dataclass field, converter)
_CONVERTERS: dict[str, tuple[str, Any]] = {
    "redundancy": ("redundancy", lambda n, v: int(_as_number(n, v, 1))),
    "publish_strategy": ("publish_strategy", None),
    "confirm_publish": ("confirm_publish", _as_bool),
    "confirm_timeout": ("confirm_timeout_s", lambda n, v: _as_number(n, v, 0.001)),
    "connect_timeout": ("connect_timeout_s", lambda n, v: _as_number(n, v, 0.001)),
    "reconnect_interval": ("reconnect_interval_s", lambda n, v: _as_number(n, v, 0.01)),
    "reconnect_max_interval": ("reconnect_max_interval_s", lambda n, v: _as_number(n, v, 0.01)),
    "redundant_queues": ("redundant_queues", lambda n, v: _as_names(v)),
    "message_ttl": ("message_ttl_s", lambda n, v: _as_number(n, v, 1)),
    "max_message_bytes": ("max_message_bytes", _as_positive_int),
    "trace_dir": ("trace_dir", lambda n, v: str(v) or None),
    "dedup_scopes": ("dedup_scopes", lambda n, v: _as_scopes(n, v)),
    "heartbeat": ("heartbeat_s", lambda n, v: _as_number(n, v, 0)),
    "ssl": ("ssl", lambda n, v: _as_ssl(v)),
}
KNOWN_OPTIONS = frozenset(_CONVERTERS) | {"additional_subscription_brokers", "broker_options"}


def build_options(
    url: str,
    transport_options: Mapping[str, Any] | None = None,
    *,
    ssl: Any = False,
    connect_timeout_s: float | None = None,
    heartbeat_s: float | None = None,
    userid: str | None = None,
    password: str | None = None,
) -> BeetleOptions:
    """Combine the URL, the transport options and kombu's connection arguments."""
    query = dict(parse_qsl(url.partition("?")[2], keep_blank_values=True)) if url else {}
    ssl = _as_ssl((transport_options or {}).get("ssl", query.get("ssl", ssl)))
    default_port = DEFAULT_SSL_PORT if ssl else DEFAULT_PORT
    parsed = parse_url(url, default_port)
    unknown_in_url = set(parsed.query) - KNOWN_OPTIONS
    if unknown_in_url:
        raise InvalidBrokerURL(
            url,
            f"unknown option(s) {', '.join(sorted(unknown_in_url))} "
            f"(known: {', '.join(sorted(KNOWN_OPTIONS))})",
        )
    merged: dict[str, Any] = dict(parsed.query)
    merged.update(transport_options or {})
    values: dict[str, Any] = {
        "brokers": parsed.brokers,
        "userid": parsed.userid or userid or "guest",
        "password": parsed.password if parsed.password is not None else (password or "guest"),
        "virtual_host": parsed.virtual_host,
    }
    if connect_timeout_s:
        values["connect_timeout_s"] = float(connect_timeout_s)
    if heartbeat_s:
        values["heartbeat_s"] = float(heartbeat_s)
    amqp_options: dict[str, Any] = {}
    for name, value in merged.items():
        if name in _CONVERTERS:
            field_name, convert = _CONVERTERS[name]
            values[field_name] = convert(name, value) if convert else value
        elif name == "additional_subscription_brokers":
            values[name] = _as_brokers(url, value, default_port)
        elif name == "broker_options":
            values[name] = dict(value)
        elif name in AMQP_CONNECTION_OPTIONS:
            amqp_options[name] = value
        elif name not in IGNORED_OPTIONS:
            raise InvalidTransportOption(
                f"unknown beetle transport option {name!r}; known: "
                f"{', '.join(sorted(KNOWN_OPTIONS | AMQP_CONNECTION_OPTIONS))}"
            )
    values["ssl"] = ssl
    values["amqp_options"] = amqp_options
    options = BeetleOptions(**values)
    _validate(url, options, redundancy_given="redundancy" in merged)
    return options


def _validate(url: str, options: BeetleOptions, *, redundancy_given: bool = False) -> None:
    """Refuse settings that cannot mean what they say. The default redundancy is kept on a
    one-broker URL (a message then goes out once, and says so in its flags); a redundancy
    asked for explicitly must have that many brokers to publish to."""
    brokers = len(options.brokers)
    if redundancy_given and options.redundancy > brokers:
        raise InvalidTransportOption(
            f"redundancy={options.redundancy} asks for {options.redundancy} copies of a message "
            f"on distinct brokers, but the URL names {brokers} broker(s) "
            f"({', '.join(b.name for b in options.brokers)}): set redundancy to at most "
            f"{brokers}, or name more brokers"
        )
    if options.publish_strategy not in PUBLISH_STRATEGIES:
        raise InvalidTransportOption(
            f"publish_strategy={options.publish_strategy!r} is not one of "
            f"{', '.join(PUBLISH_STRATEGIES)}"
        )
    if options.reconnect_max_interval_s < options.reconnect_interval_s:
        raise InvalidTransportOption(
            "reconnect_max_interval must be >= reconnect_interval "
            f"({options.reconnect_max_interval_s} < {options.reconnect_interval_s})"
        )
    unknown = set(options.broker_options) - {b.name for b in options.all_brokers}
    if unknown:
        raise InvalidTransportOption(
            f"broker_options names broker(s) not in the URL: {', '.join(sorted(unknown))}"
        )
