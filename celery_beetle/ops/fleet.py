"""Who consumes the queues: every consumer on every broker, beetle or not, and its version.

A plain Celery worker (``pyamqp://``, no dedup gate) consuming a queue that receives
redundant copies runs every message twice; a beetle worker older than the publishers may
not know what they send. Both are invisible to a deploy pipeline until they hurt. The
transport announces itself in its AMQP client properties (``product: kombu-beetle`` and
``beetle_version``, :mod:`kombu_beetle.identity`), which the management API shows for each
connection; this module joins ``/api/consumers`` with ``/api/connections`` on every broker
and classifies each consumer:

=========  =================================================================
``beetle``  a kombu-beetle connection at least as new as ``minimum``
``older``   a kombu-beetle connection older than ``minimum``
``plain``   anything else (``py-amqp``, pika, a shovel, ...): no dedup
``unknown`` a consumer whose connection the API does not show (yet)
=========  =================================================================

The management API's statistics lag the broker by a few seconds: a consumer can be listed
before its connection is, or after its connection closed. :func:`survey` reads again while
such a consumer remains, for up to ``settle_s`` seconds, and reports what is still unknown
as ``unknown``, which is flagged like a plain consumer: it cannot be shown to be beetle.

Celery's own queues (remote control ``*.pidbox``, events ``celeryev.*``, replies) are left
out unless named: every worker consumes them, and no task runs from them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from celery_beetle.ops.management import ManagementClient, ManagementError
from kombu_beetle.identity import PRODUCT, VERSION_PROPERTY, package_version

__all__ = ["FleetConsumer", "FleetReport", "survey", "version_tuple"]

#: queues every Celery worker consumes that carry no tasks
_CELERY_INTERNAL = re.compile(r"(\.pidbox$|^celeryev\.|\.reply\.celery\.pidbox$|^amq\.)")


@dataclass(frozen=True)
class FleetConsumer:
    broker: str
    queue: str
    connection: str
    product: str
    version: str
    kind: str  # beetle, older, plain, unknown
    peer: str

    def describe(self) -> str:
        return (
            f"{self.kind:<6}  {self.broker}  {self.queue}  {self.product} {self.version}  "
            f"{self.peer}"
        )


@dataclass
class FleetReport:
    consumers: list[FleetConsumer]
    errors: dict[str, str]
    minimum: str

    @property
    def flagged(self) -> list[FleetConsumer]:
        return [c for c in self.consumers if c.kind != "beetle"]

    @property
    def ok(self) -> bool:
        return not self.flagged and not self.errors


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.2.0.dev1"`` -> ``(0, 2, 0)``: the release numbers, for comparing versions."""
    numbers: list[int] = []
    for part in version.split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() != len(part):
            break
    return tuple(numbers)


def classify(properties: dict[str, Any], minimum: str) -> tuple[str, str, str]:
    """``(kind, product, version)`` of a connection from its client properties."""
    product = str(properties.get("product") or "unknown")
    if product != PRODUCT:
        # pika and the Java client send "version"; py-amqp (a plain Celery worker) sends
        # "product_version" only
        version = properties.get("version") or properties.get("product_version")
        return "plain", product, str(version or "?")
    version = str(properties.get(VERSION_PROPERTY) or properties.get("version") or "0")
    kind = "older" if version_tuple(version) < version_tuple(minimum) else "beetle"
    return kind, product, version


def survey(
    clients: Sequence[ManagementClient],
    queues: Iterable[str] = (),
    minimum: str | None = None,
    *,
    settle_s: float = 10.0,
    interval_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> FleetReport:
    """Every consumer of ``queues`` (all task queues when empty) on every broker, read again
    every ``interval_s`` while one is ``unknown``, for up to ``settle_s`` seconds."""
    wanted = set(queues)
    minimum = minimum or package_version()
    report = _survey_once(clients, wanted, minimum)
    waited = 0.0
    while waited < settle_s and any(c.kind == "unknown" for c in report.consumers):
        sleep(interval_s)
        waited += interval_s
        report = _survey_once(clients, wanted, minimum)
    return report


def _survey_once(
    clients: Sequence[ManagementClient], wanted: set[str], minimum: str
) -> FleetReport:
    found: list[FleetConsumer] = []
    errors: dict[str, str] = {}
    for client in clients:
        try:
            consumers = client.consumers()
            connections = {c.get("name"): c for c in client.connections()}
        except ManagementError as exc:
            errors[client.name] = str(exc)
            continue
        for consumer in consumers:
            queue = (consumer.get("queue") or {}).get("name", "")
            if wanted and queue not in wanted:
                continue
            if not wanted and _CELERY_INTERNAL.search(queue):
                continue
            details = consumer.get("channel_details") or {}
            name = details.get("connection_name", "")
            connection = connections.get(name)
            if connection is None:
                kind, product, version = "unknown", "unknown", "?"
            else:
                kind, product, version = classify(
                    dict(connection.get("client_properties") or {}), minimum
                )
            peer = f"{details.get('peer_host', '?')}:{details.get('peer_port', '?')}"
            found.append(FleetConsumer(client.name, queue, name, product, version, kind, peer))
    found.sort(key=lambda c: (c.kind == "beetle", c.queue, c.broker, c.peer))
    return FleetReport(found, errors, minimum)
