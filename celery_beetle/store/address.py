"""Where the dedup store lives: its URL, parsed (:func:`~celery_beetle.parse_store_url`) and
connected to.

The dedup store's URL (``beetle_redis_url``, ``beetle status --redis``) takes one of these
forms::

    redis://[[user]:password@]host[:port][/db]
    rediss://[[user]:password@]host[:port][/db]              TLS
    unix://[[user]:password@]/path/to/redis.sock[?db=N]
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]
    redis+cluster://[[user]:password@]host:port[,host:port...]

``rediss+sentinel://`` and ``rediss+cluster://`` use TLS. Every TLS form takes the same query
options: ``?ssl_ca_certs=`` (a CA bundle file), ``ssl_ca_path=`` (a directory of CAs),
``ssl_certfile=`` and ``ssl_keyfile=`` (a client certificate), ``ssl_cert_reqs=``
(``required``, the default; ``optional``; ``none``) and ``ssl_check_hostname=`` (``true`` by
default unless ``ssl_cert_reqs=none``): the certificate of every node, Sentinels included, is
checked against the host it is reached at (for a Sentinel's master or a Cluster's nodes, the
address they announce, often an IP). The password is the data node's;
Sentinels that need their own take ``?sentinel_password=...``. Sentinel and Cluster URLs
also take ``?socket_timeout=`` and ``?socket_connect_timeout=`` (seconds).

The settings check a URL when they are built (:class:`celery_beetle.settings.BeetleSettings`),
so that a typo stops the worker before its first message; the store connects to it
(``RedisStore.from_url``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from kombu_beetle.urls import mask_url, parse_host_port

__all__ = [
    "EXPECTED_URL_FORMS",
    "TLS_OPTIONS",
    "StoreAddress",
    "connect",
    "parse_store_url",
    "pooled_connection",
]

EXPECTED_URL_FORMS = (
    "redis://[[user]:password@]host[:port][/db], "
    "rediss://[[user]:password@]host[:port][/db], "
    "unix://[[user]:password@]/path/to/redis.sock[?db=N], "
    "redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db], "
    "redis+cluster://[[user]:password@]host:port[,host:port...]"
)

_SCHEMES = {
    "redis": ("redis", False),
    "rediss": ("redis", True),
    "unix": ("redis", False),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
#: TLS options of every ``rediss`` form: redis-py's connection arguments of the same names
TLS_OPTIONS = frozenset(
    {
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_cert_reqs",
        "ssl_check_hostname",
    }
)
_CERT_REQS = ("required", "optional", "none")
_TIMEOUTS = {"socket_timeout", "socket_connect_timeout"}
_MULTI_HOST_OPTIONS = TLS_OPTIONS | _TIMEOUTS | {"sentinel_password"}
_DEFAULT_PORTS = {"redis": 6379, "sentinel": 26379, "cluster": 6379}


@dataclass(frozen=True)
class StoreAddress:
    """A parsed store URL: which client to build, and where to."""

    kind: str  # "redis", "sentinel" or "cluster"
    url: str
    tls: bool
    hosts: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    db: int = 0
    service_name: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    def tls_kwargs(self) -> dict[str, Any]:
        """redis-py's ``ssl_*`` arguments for every node (empty without TLS).

        Verification is explicit rather than left to the redis-py version: a certificate
        is required and must name the host, unless the URL says ``ssl_cert_reqs=none``.
        """
        if not self.tls:
            return {}
        given = {k: v for k, v in self.options.items() if k in TLS_OPTIONS}
        cert_reqs = given.get("ssl_cert_reqs", "required").lower()
        kwargs: dict[str, Any] = {**given, "ssl_cert_reqs": cert_reqs}
        check = given.get("ssl_check_hostname")
        kwargs["ssl_check_hostname"] = (
            cert_reqs != "none" if check is None else check.lower() in ("1", "true", "yes")
        )
        return kwargs


def parse_store_url(url: str) -> StoreAddress:
    """Check a store URL and split it up; a ValueError says what is wrong and what is expected."""

    def bad(why: str) -> ValueError:
        return ValueError(f"bad Redis URL {mask_url(url)!r}: {why}; expected {EXPECTED_URL_FORMS}")

    if not url:
        raise bad("it is empty")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise bad(f"unknown scheme {scheme!r}" if sep else "no scheme")
    kind, tls = _SCHEMES[scheme.lower()]
    if scheme.lower() == "unix":
        return StoreAddress(kind, url, tls)
    rest, _, query = rest.partition("?")
    location, _, path = rest.partition("/")
    userinfo, _, hostlist = location.rpartition("@")
    username, password = _userinfo(userinfo)
    if not hostlist:
        raise bad("no host")
    hosts = tuple(_host_port(h, _DEFAULT_PORTS[kind], bad) for h in hostlist.split(","))
    parts = [p for p in path.split("/") if p]
    options = dict(parse_qsl(query))
    tls_given = set(options) & TLS_OPTIONS
    if tls_given and not tls:
        raise bad(
            f"{', '.join(sorted(tls_given))} need TLS: write rediss://, rediss+sentinel:// "
            f"or rediss+cluster://"
        )
    if options.get("ssl_cert_reqs", "required").lower() not in _CERT_REQS:
        raise bad(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}")
    if options.get("ssl_check_hostname", "true").lower() not in ("1", "0", "true", "false"):
        raise bad("ssl_check_hostname must be true or false")
    if kind == "redis":
        if len(hosts) > 1:
            raise bad("several hosts need redis+sentinel:// or redis+cluster://")
        if len(parts) > 1 or (parts and not parts[0].isdigit()):
            raise bad(f"the path {path!r} is not a database number")
        db = int(parts[0]) if parts else 0
        tls_options = {k: v for k, v in options.items() if k in TLS_OPTIONS}
        return StoreAddress(kind, url, tls, hosts, username, password, db, options=tls_options)
    unknown = set(options) - _MULTI_HOST_OPTIONS
    if unknown:
        raise bad(f"unknown option(s) {', '.join(sorted(unknown))}")
    if kind == "cluster":
        if parts:
            raise bad("a cluster has no database or service name in the path")
        return StoreAddress(kind, url, tls, hosts, username, password, options=options)
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise bad("a sentinel URL needs /service_name[/db] after the hosts")
    db = int(parts[1]) if len(parts) == 2 else 0
    return StoreAddress(kind, url, tls, hosts, username, password, db, unquote(parts[0]), options)


def _userinfo(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    user, sep, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if sep else None)


def _host_port(text: str, default_port: int, bad: Callable[[str], ValueError]) -> tuple[str, int]:
    try:
        return parse_host_port(text, default_port)
    except ValueError as exc:
        raise bad(str(exc)) from None


# A hung Redis must not hang the worker: the gate and the pool both wait on it.
_CLIENT_DEFAULTS: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}


def connect(url: str, **client_kwargs: Any) -> Any:
    """A redis-py client for a store URL: Redis, a Sentinel-managed master, or a Cluster."""
    address = parse_store_url(url)
    kwargs = {**_CLIENT_DEFAULTS, "decode_responses": True, **client_kwargs}
    options = dict(address.options)
    timeouts = ("socket_timeout", "socket_connect_timeout")
    for name in timeouts:
        if name in options:
            kwargs[name] = float(options.pop(name))
    tls = address.tls_kwargs()
    for name in tls:
        options.pop(name, None)
    if address.kind == "redis":
        # the URL's own ssl_* query values reach redis-py too, parsed alike
        return redis.Redis.from_url(url, **{**kwargs, **tls})
    kwargs.update(username=address.username, password=address.password)
    if address.kind == "cluster":
        nodes = [ClusterNode(host, port) for host, port in address.hosts]
        return RedisCluster(startup_nodes=nodes, ssl=address.tls, **tls, **kwargs)
    sentinel_kwargs: dict[str, Any] = {name: kwargs[name] for name in timeouts if name in kwargs}
    sentinel_kwargs.update(ssl=address.tls, **tls)
    if "sentinel_password" in options:
        sentinel_kwargs["password"] = options["sentinel_password"]
    sentinel = Sentinel(
        list(address.hosts), sentinel_kwargs=sentinel_kwargs, ssl=address.tls, **tls
    )
    assert address.service_name is not None
    return sentinel.master_for(address.service_name, db=address.db, **kwargs)


#: redis-py before 5.3 requires a command name in ``ConnectionPool.get_connection`` (any name
#: will do); from 5.3 on, passing one is deprecated
_POOL_WANTS_COMMAND_NAME = tuple(int(part) for part in redis.__version__.split(".")[:2]) < (5, 3)


def pooled_connection(pool: Any) -> Any:
    """A connection taken from redis-py's ``pool``, on every redis-py the project supports."""
    if _POOL_WANTS_COMMAND_NAME:
        return pool.get_connection("PING")
    return pool.get_connection()
