"""Workers keep their queues' policies applied: a consumer bootstep over
:class:`~celery_beetle.ops.applier.PolicyApplier`.

Settings (``app.conf``), all optional; without ``beetle_queue_policies`` the step does nothing:

============================  ===================================================================
``beetle_queue_policies``     ``{"default": {...}, "queues": {name: {...}}, "priority": n}``
                              (:class:`~celery_beetle.ops.policies.PolicyConfig`)
``beetle_management``         where the management API is: ``port``, ``scheme``, ``user``,
                              ``password``, ``verify``, ``timeout_s``, ``urls``
                              (:class:`~celery_beetle.ops.management.ManagementConfig`)
``beetle_policy_interval``    seconds between two rounds (30)
============================  ===================================================================

The managed queues are those the worker consumes, and those the config names. The applier
runs on a daemon thread, so a worker never waits for a management API (nor fails for one:
an unreachable API is logged and tried again next round). One worker of a fleet sharing a
dedup store does each round (:class:`~celery_beetle.ops.applier.FleetLock`, keyed by the
brokers, the vhost and what the config asks): 500 workers starting at once make one
round of management calls per interval, not 500.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import bootsteps
from celery.exceptions import ImproperlyConfigured

from celery_beetle.ops.applier import FleetLock, PolicyApplier
from celery_beetle.ops.management import ManagementConfig, clients_for_url
from celery_beetle.ops.policies import PolicyConfig

__all__ = ["BeetlePolicyStep"]

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 30.0


class BeetlePolicyStep(bootsteps.StartStopStep):
    """Starts the policy applier once the consumer knows its queues."""

    name = "celery_beetle.ops.worker.BeetlePolicyStep"
    label = "Beetle queue policies"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.applier: PolicyApplier | None = None
        conf = c.app.conf
        raw = conf.get("beetle_queue_policies")
        self.broker_url = str(conf.get("broker_url") or "")
        self.enabled = bool(raw) and self.broker_url.startswith("beetle://")
        if not self.enabled:
            return
        try:
            self.config = PolicyConfig.from_mapping(raw)
            self.management = ManagementConfig(**dict(conf.get("beetle_management") or {}))
            self.interval_s = float(conf.get("beetle_policy_interval") or DEFAULT_INTERVAL_S)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"celery_beetle: {exc}") from exc

    def start(self, c: Any) -> None:
        if not self.enabled or self.applier is not None:
            return
        consumed = [q.name for q in c.app.amqp.queues.consume_from.values()]
        queues = sorted({*consumed, *self.config.queues})
        clients = clients_for_url(
            self.broker_url,
            self.management,
            c.app.conf.get("broker_transport_options") or {},
        )
        lock = None
        redis_url = c.app.conf.get("beetle_redis_url")
        if redis_url:
            from celery_beetle.store import connect

            prefix = c.app.conf.get("beetle_key_prefix") or "beetle:"
            fingerprint = self.config.fingerprint(queues + [cl.base_url for cl in clients])
            lock = FleetLock(
                connect(redis_url, socket_timeout=2.0, socket_connect_timeout=2.0),
                f"{prefix}ops:policies:{clients[0].vhost}:{fingerprint}",
                ttl_ms=round(self.interval_s * 1000),
            )
        self.applier = PolicyApplier(
            clients,
            queues,
            self.config,
            interval_s=self.interval_s,
            lock=lock,
            owner=f"{getattr(c, 'hostname', None) or socket.gethostname()}:{os.getpid()}",
        ).start()
        logger.info("beetle: keeping queue policies of %s on %d broker(s)", queues, len(clients))

    def shutdown(self, c: Any) -> None:
        if self.applier is not None:
            self.applier.stop(timeout=1.0)
            self.applier = None
