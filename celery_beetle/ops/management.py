"""A client of RabbitMQ's management HTTP API, one per broker of a ``beetle://`` URL.

The transport never talks HTTP (it composes AMQP connections and nothing else); everything
that needs the management API lives here, on the worker and operator side.

Where each broker's API is (:class:`ManagementConfig`):

* by default ``http://<broker host>:15672``, with the URL's AMQP user and password;
* ``port``, ``scheme`` (``https`` for TLS), ``user``/``password`` change that for all
  brokers; ``verify`` is requests' (True, False, or a CA bundle's path);
* ``urls`` names one broker's API exactly: ``{"rabbit1:5672": "https://rabbit1:15671"}``.

Every call is bounded by ``timeout_s``; a broker whose API does not answer raises
:class:`ManagementUnreachable`, which callers report and never let stop publishing or
consuming.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import requests

from kombu_beetle.options import BeetleOptions, BrokerAddress, build_options

__all__ = [
    "DEFAULT_MANAGEMENT_PORT",
    "ManagementClient",
    "ManagementConfig",
    "ManagementError",
    "ManagementUnreachable",
    "clients_for_url",
]

DEFAULT_MANAGEMENT_PORT = 15672


class ManagementError(RuntimeError):
    """The management API answered with an error (a 4xx or 5xx other than a 404 on a GET)."""


class ManagementUnreachable(ManagementError):
    """The management API of a broker did not answer (connection refused, timeout)."""


@dataclass(frozen=True)
class ManagementConfig:
    """Where the management API of each broker is, and how to log in."""

    port: int = DEFAULT_MANAGEMENT_PORT
    scheme: str = "http"
    #: None: the ``beetle://`` URL's AMQP credentials
    user: str | None = None
    password: str | None = None
    verify: bool | str = True
    timeout_s: float = 5.0
    #: ``{"host:port" of a broker: base URL of its API}``, overriding the defaults
    urls: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scheme not in ("http", "https"):
            raise ValueError(f"management scheme must be 'http' or 'https', not {self.scheme!r}")

    def __repr__(self) -> str:
        return (
            f"ManagementConfig(port={self.port}, scheme={self.scheme!r}, user={self.user!r}, "
            f"password={'**' if self.password else None}, urls={dict(self.urls)!r})"
        )

    def base_url(self, broker: BrokerAddress) -> str:
        given = self.urls.get(broker.name)
        if given:
            return given.rstrip("/")
        host = f"[{broker.host}]" if ":" in broker.host else broker.host
        return f"{self.scheme}://{host}:{self.port}"


class ManagementClient:
    """The management API of one broker, for one vhost."""

    def __init__(
        self,
        base_url: str,
        vhost: str,
        auth: tuple[str, str],
        *,
        name: str | None = None,
        verify: bool | str = True,
        timeout_s: float = 5.0,
        session: requests.Session | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.vhost = vhost
        self.name = name or self.base_url
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self.session.auth = auth
        self.verify = verify
        #: HTTP calls that change something (PUT, DELETE, POST), for tests and reports
        self.writes = 0
        self.reads = 0

    def __repr__(self) -> str:
        return f"<ManagementClient {self.name} {self.base_url} vhost={self.vhost!r}>"

    # -- policies ----------------------------------------------------------------------------

    def policies(self) -> list[dict[str, Any]]:
        """Every policy of the vhost, as the API returns them."""
        return list(self._call("GET", f"/api/policies/{self._vhost}") or [])

    def put_policy(self, name: str, body: Mapping[str, Any]) -> None:
        self._call("PUT", f"/api/policies/{self._vhost}/{quote(name, safe='')}", body)

    def delete_policy(self, name: str) -> None:
        self._call("DELETE", f"/api/policies/{self._vhost}/{quote(name, safe='')}")

    # -- queues ------------------------------------------------------------------------------

    def queues(self) -> list[dict[str, Any]]:
        """Name, arguments, effective policy and type of every queue of the vhost."""
        path = f"/api/queues/{self._vhost}?columns=name,arguments,policy,type,durable"
        return list(self._call("GET", path) or [])

    def queue(self, name: str) -> dict[str, Any] | None:
        """One queue, or None if it does not exist."""
        result = self._call("GET", f"/api/queues/{self._vhost}/{quote(name, safe='')}")
        return dict(result) if result is not None else None

    def declare_queue(self, name: str, arguments: Mapping[str, Any] | None = None) -> None:
        """Declare a durable classic queue (a no-op if it exists with these arguments)."""
        body = {"durable": True, "auto_delete": False, "arguments": dict(arguments or {})}
        self._call("PUT", f"/api/queues/{self._vhost}/{quote(name, safe='')}", body)

    def queue_bindings(self, name: str) -> list[dict[str, Any]]:
        """The bindings of queue ``name`` from named exchanges (the default exchange's
        implicit binding left out): what a re-created queue must get again."""
        path = f"/api/queues/{self._vhost}/{quote(name, safe='')}/bindings"
        return [
            {
                "exchange": b["source"],
                "routing_key": b.get("routing_key", ""),
                "arguments": dict(b.get("arguments") or {}),
            }
            for b in (self._call("GET", path) or [])
            if b.get("source")
        ]

    def consumers(self) -> list[dict[str, Any]]:
        """Every consumer of the vhost: its queue, tag and channel (connection name)."""
        return list(self._call("GET", f"/api/consumers/{self._vhost}") or [])

    def connections(self) -> list[dict[str, Any]]:
        """Every connection of the vhost, with the client properties it announced."""
        return list(self._call("GET", f"/api/vhosts/{self._vhost}/connections") or [])

    def overview(self) -> dict[str, Any]:
        return dict(self._call("GET", "/api/overview") or {})

    # -- internals ---------------------------------------------------------------------------

    @property
    def _vhost(self) -> str:
        return quote(self.vhost, safe="")

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        if method == "GET":
            self.reads += 1
        else:
            self.writes += 1
        url = self.base_url + path
        try:
            # verify per request: requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a
            # session's verify, so a CA given here would silently be replaced by the system's
            response = self.session.request(
                method,
                url,
                json=None if body is None else dict(body),
                timeout=self.timeout_s,
                verify=self.verify,
            )
        except requests.RequestException as exc:
            raise ManagementUnreachable(f"{method} {url}: {exc}") from exc
        if method == "GET" and response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise ManagementError(
                f"{method} {url}: {response.status_code} {response.text.strip()[:300]}"
            )
        if not response.content:
            return None
        return response.json()


def clients_for_url(
    url: str,
    config: ManagementConfig | None = None,
    transport_options: Mapping[str, Any] | None = None,
) -> list[ManagementClient]:
    """One client per broker of the ``beetle://`` ``url`` (consume-only brokers included:
    a queue they hold dead-letters like any other)."""
    options = build_options(url, transport_options)
    return clients_for_options(options, config)


def clients_for_options(
    options: BeetleOptions, config: ManagementConfig | None = None
) -> list[ManagementClient]:
    config = config or ManagementConfig()
    auth = (config.user or options.userid, config.password or options.password)
    return [
        ManagementClient(
            config.base_url(broker),
            options.virtual_host,
            auth,
            name=broker.name,
            verify=config.verify,
            timeout_s=config.timeout_s,
        )
        for broker in options.all_brokers
    ]
