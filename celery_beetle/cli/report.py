"""What ``beetle status`` reports: each broker of a ``beetle://`` URL, and the dedup store.

Each broker is asked directly, over its own connection (not through the transport, which
hides a dead broker by design), so an operator sees which one is down, its RabbitMQ
version and, for the queues asked about, how many messages are ready and how many
consumers it has.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import amqp

from kombu_beetle.brokers import BrokerLink
from kombu_beetle.options import build_options

__all__ = ["BrokerStatus", "StoreStatus", "brokers", "store"]


@dataclass
class BrokerStatus:
    name: str
    up: bool
    consume_only: bool = False
    version: str | None = None
    error: str | None = None
    #: queue -> (ready messages, consumers); None where the queue does not exist
    queues: dict[str, tuple[int, int] | None] = field(default_factory=dict)


@dataclass
class StoreStatus:
    url: str
    up: bool
    latency_ms: float | None = None
    keys: int | None = None
    used_memory: str | None = None
    error: str | None = None


def brokers(
    url: str, queues: Iterable[str] = (), transport_options: Mapping[str, Any] | None = None
) -> list[BrokerStatus]:
    """Connect to every broker of ``url`` in turn and describe it."""
    options = build_options(url, {"connect_timeout": 2.0, **(transport_options or {})})
    consume_only = set(options.all_brokers) - set(options.brokers)
    result = []
    for address in options.all_brokers:
        status = BrokerStatus(address.name, up=False, consume_only=address in consume_only)
        try:
            conn = BrokerLink(address, options).connect()
        except Exception as exc:
            status.error = f"{type(exc).__name__}: {exc}"
            result.append(status)
            continue
        status.up = True
        status.version = str(conn.server_properties.get("version", "?"))
        try:
            channel = conn.channel()
            for queue in queues:
                try:
                    ok = channel.queue_declare(queue, passive=True)
                    status.queues[queue] = (ok.message_count, ok.consumer_count)
                except amqp.exceptions.NotFound:
                    status.queues[queue] = None
                    channel = conn.channel()  # a 404 closes the channel
        finally:
            conn.close()
        result.append(status)
    return result


def store(url: str) -> StoreStatus:
    """Ping the dedup store and say how big it is."""
    from celery_beetle.settings import mask_url
    from celery_beetle.store import connect

    status = StoreStatus(mask_url(url), up=False)
    try:
        client = connect(url, socket_timeout=2, socket_connect_timeout=2)
        started = time.perf_counter()
        client.ping()
        status.latency_ms = round((time.perf_counter() - started) * 1000, 2)
        info = client.info("memory")
        status.used_memory = str(info.get("used_memory_human"))
        status.keys = int(client.dbsize())
        status.up = True
    except Exception as exc:
        status.error = f"{type(exc).__name__}: {exc}"
    return status
