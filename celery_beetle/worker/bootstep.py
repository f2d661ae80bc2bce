"""The consumer bootstep that puts the gate in front of every BeetleTask's strategy.

Celery hands each task message to the task's *strategy*, in the worker's main process,
before a pool slot is involved.
This step wraps the strategies of BeetleTasks in a :class:`~.strategy.GatedStrategy`, so that
each delivery passes through :class:`~celery_beetle.worker.gate.DeliveryGate` first.
Plain tasks keep Celery's strategy as is.

==============  ==========================================================================
when            what the step does
==============  ==========================================================================
construction    reads and validates the settings and every BeetleTask's options (a bad one
                raises :class:`celery.exceptions.ImproperlyConfigured` with the reason), and
                derives each BeetleTask's time limits from its lease
start           makes a prefork pool count those limits from each run's stored start
                (:func:`~.time_limits.count_limits_from_the_start`), builds the gate once,
                probes the store (a store away is said at once), and gates the strategies
                (Celery rebuilds them on every consumer start)
stop            the gate forgets what it holds: the consumer's connection is going away
==============  ==========================================================================
"""

from __future__ import annotations

import logging
import os
import socket
from functools import partial
from typing import Any

from celery import bootsteps
from celery.exceptions import ImproperlyConfigured

from celery_beetle import metrics
from celery_beetle.settings import BeetleSettings
from celery_beetle.store import RedisStore, wall_clock_ms
from celery_beetle.store.health import RedisProbe, store_unavailable
from celery_beetle.store.outcome import Rejected
from celery_beetle.worker.deadletter import dead_letter_delivery
from celery_beetle.worker.facts import InvalidHeader, message_facts
from celery_beetle.worker.gate import DeliveryGate
from celery_beetle.worker.gate_reads import pipelined_reads_for
from celery_beetle.worker.metrics import GateCollector
from celery_beetle.worker.renewal import DeliveryRenewal
from celery_beetle.worker.runnable import is_beetle_task
from celery_beetle.worker.strategy import GatedStrategy
from celery_beetle.worker.time_limits import count_limits_from_the_start
from celery_beetle.worker.wiring import (
    ClaimLimits,
    TwinFilter,
    UnknownTaskHandler,
    WorkerTimer,
    no_claims,
    pool_free_for,
)
from kombu_beetle.renewal import SameBrokerPublisher
from kombu_beetle.trace import get_tracer
from kombu_beetle.urls import mask_url

__all__ = ["BeetleGateStep", "load_settings"]

logger = logging.getLogger(__name__)

#: The main process's store waits this long for Redis before pausing the consumer.
GATE_SOCKET_TIMEOUT_S = 2.0


def load_settings(app: Any) -> BeetleSettings:
    """The app's beetle settings and each BeetleTask's options, validated; or a clear error."""
    try:
        settings = BeetleSettings.from_app(app)
        for task in app.tasks.values():
            if is_beetle_task(task):
                task.apply_beetle_time_limits()
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"celery_beetle: {exc}") from exc
    return settings


class BeetleGateStep(bootsteps.StartStopStep):
    """Gate BeetleTask deliveries in the main process (see :mod:`celery_beetle.worker.gate`)."""

    #: the step's name in the blueprint, kept from the module it was first defined in, so that
    #: a step naming it (``requires``) or a lookup by name finds it across the move
    name = "celery_beetle.bootstep.BeetleGateStep"
    label = "Beetle gate"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.settings = load_settings(c.app)
        self.store: RedisStore | None = None
        self.probe: RedisProbe | None = None
        self.gate: DeliveryGate | None = None
        self.renewal: DeliveryRenewal | None = None
        self.renewal_publisher = SameBrokerPublisher()
        self.queue_names: dict[str, str] = {}
        #: the gate's id in the store (a bad input's dead letter is owed by it)
        self.owner = f"gate@{getattr(c, 'hostname', None) or socket.gethostname()}:{os.getpid()}"
        c.beetle_gate = self
        self.metrics_server: Any = None
        if self.settings.metrics_port is not None:
            _prepare_metrics()

    def start(self, c: Any) -> None:
        count_limits_from_the_start(getattr(c, "pool", None), getattr(c, "hub", None))
        if self.gate is None:
            self.gate = self._make_gate(c)
        else:
            self.gate.reset()
        self.gate.pause_if_unreachable()  # said now, not at the first delivery
        hub = getattr(c, "hub", None)
        if hub is not None and self.gate.pool_free is not None:
            hub.on_tick.add(self.gate.dispatch.on_tick)  # a set: once, however many starts
        if self.settings.metrics_port is not None and self.metrics_server is None:
            self.metrics_server = self._serve_metrics()
        self.queue_names = {}
        self.renewal = self._renewal(c)
        gated = []
        for name, task in c.app.tasks.items():
            strategy = c.strategies.get(name)
            if strategy is not None and is_beetle_task(task):
                if not getattr(strategy, "beetle_gated", False):
                    c.strategies[name] = GatedStrategy(
                        strategy, name, self.gate, c, lambda: self.renewal
                    )
                gated.append(name)
        self._filter_twins(c, frozenset(gated))
        if "on_unknown_task" not in vars(c):
            c.on_unknown_task = UnknownTaskHandler(c.app, self.current_gate, c.on_unknown_task)
        logger.info(
            "beetle: gating %d task(s) (%s reads): %s",
            len(gated),
            "pipelined" if self.gate.reads is not None else "synchronous",
            ", ".join(sorted(gated)),
        )

    def _filter_twins(self, c: Any, gated: frozenset[str]) -> None:
        """Let the gate see a gated task's deliveries before kombu makes Messages of them
        (``beetle://`` only: :data:`kombu_beetle.channel_host.DeliveryFilter`), so that the
        second copy of a message already running here costs almost nothing."""
        connection = getattr(getattr(c, "connection", None), "_connection", None)
        if connection is None or not hasattr(connection, "delivery_filter"):
            return
        assert self.gate is not None
        connection.delivery_filter = TwinFilter(self.gate, gated)

    def _renewal(self, c: Any) -> DeliveryRenewal | None:
        """Renewal of deliveries a quorum queue counted often (``beetle://`` only: it
        publishes each copy on the broker that delivered it)."""
        connection = getattr(getattr(c, "connection", None), "_connection", None)
        if connection is None or not hasattr(connection, "delivery_filter"):
            return None
        return DeliveryRenewal(self.settings.delivery_renewal, self.renewal_publisher.publish_again)

    def _serve_metrics(self) -> Any:
        port, addr = self.settings.metrics_port, self.settings.metrics_addr
        assert port is not None
        try:
            return metrics.serve(port, addr, [GateCollector(self.current_gate)], True)
        except OSError as exc:
            raise ImproperlyConfigured(
                f"celery_beetle: cannot serve metrics on {addr}:{port} ({exc.strerror or exc}): "
                "is another worker on this host using beetle_metrics_port? Give each its own"
            ) from exc

    def current_gate(self) -> DeliveryGate | None:
        """The gate, once the step has started (the metrics and the unknown-task handler
        read it when they are called)."""
        return self.gate

    def close(self, c: Any) -> None:
        """A warm shutdown begins (Celery closes the consumer before its pool finishes)."""
        if self.gate is not None:
            hub = getattr(c, "hub", None)
            if hub is not None:  # what waits for a pool process stays unacked, redelivered
                hub.on_tick.discard(self.gate.dispatch.on_tick)
            self.gate.drain_while_stopping()

    def stop(self, c: Any) -> None:
        if self.gate is not None:
            self.gate.reset()

    def shutdown(self, c: Any) -> None:
        if self.gate is not None:  # the pool has finished: nothing more will be owed
            self.gate.store_owed(self.settings.shutdown_store_wait_s)
        self.stop(c)
        for closable in (self.store, self.probe, self.renewal_publisher):
            if closable is not None:
                try:
                    closable.close()
                except Exception:
                    pass

    # -- wiring ----------------------------------------------------------------------------

    def _make_gate(self, c: Any) -> DeliveryGate:
        settings = self.settings
        self.store = RedisStore.from_url(
            settings.redis_url,
            key_prefix=settings.key_prefix,
            ttl_margin_ms=settings.key_ttl_margin_ms,
            wait_replicas=settings.redis_wait_replicas,  # the gate writes too (claims, releases)
            socket_timeout=GATE_SOCKET_TIMEOUT_S,
            socket_connect_timeout=GATE_SOCKET_TIMEOUT_S,
        )
        # the probe writes as the store does: with the replicas' acks the settings require
        self.probe = RedisProbe(
            settings.redis_url,
            key=f"{settings.key_prefix}probe:{self.owner}",
            wait_replicas=settings.redis_wait_replicas,
        )

        reads = pipelined_reads_for(self.store, getattr(c, "hub", None), GATE_SOCKET_TIMEOUT_S)
        # a batch does not WAIT for replicas: with wait_replicas the gate reads, the pool claims
        claims = reads is not None and not self.store.wait_replicas
        # the gate writes a batch's outcome events at once, after the batch (its
        # ``after_batch``), not a write per ``completed`` event on the worker's event loop; a
        # batch that settled nothing leaves its events to the writer's thread. A copy dropped
        # in a batch (a ``duplicate``, an ``expired``) is written before its ack too, like a
        # completion (DeliveryGate.after_batch): a ``duplicate`` of a completed message is the
        # evidence of a completion whose own event died with its worker
        outcomes = ["completed", "dead_lettered", "expired"]
        if reads is not None:
            outcomes.append("duplicate")
        tracer = get_tracer(
            settings.trace_dir, role="gate", defer_sync=reads is not None, sync_events=outcomes
        )
        return DeliveryGate(
            store=self.store,
            call_later=WorkerTimer(c),
            qos=lambda: c.qos,  # Celery replaces its QoS object when the consumer restarts
            dead_letter=partial(self.dead_letter_once, c),
            queue_of=partial(self.queue_of, c),
            scopes=settings.dedup_scopes,
            probe=self.probe,
            tracer=tracer,
            message_ttl_ms=settings.message_ttl_ms,
            worker=getattr(c, "hostname", None),
            reads=reads,
            claims_for=ClaimLimits(c.app) if claims else no_claims,
            pool_free=pool_free_for(c) if settings.claim_in_idle_pool else None,
            max_deferred=settings.max_deferred,
            max_deferred_bytes=settings.max_deferred_bytes,
            unknown_task_grace_ms=round(settings.unknown_task_grace_s * 1000),
            store_name=mask_url(settings.redis_url),
        )

    def queue_of(self, c: Any, message: Any) -> str:
        """The queue a delivery came from: its consumer tag names it (kombu_beetle uses one
        tag per queue on every broker); the routing key if the tag is unknown."""
        info = message.delivery_info or {}
        tag = info.get("consumer_tag")
        queue = self.queue_names.get(tag) if tag else None
        if queue is None and tag:
            active = getattr(c.task_consumer, "_active_tags", {}) or {}
            self.queue_names = {t: q for q, t in active.items()}
            queue = self.queue_names.get(tag)
        return queue or info.get("routing_key") or "celery"

    def dead_letter_once(
        self, c: Any, message: Any, queue: str, reason: str, detail: str
    ) -> float | None:
        """Dead-letter bad input once per message, not once per copy: every copy of a
        redundant message is equally bad, so the store lets the first one through
        (:meth:`~celery_beetle.store.base.Store.reject`) and the others are only acked.

        Returns None when the message may be acked, or seconds after which to hand it back
        (another worker is publishing its dead letter). Raises when the dead letter is not
        stored: the gate hands the message back, and the record keeps it owed. Without a
        usable ``message_id``, or with Redis unavailable, every copy is dead-lettered: two
        dead letters are better than none."""
        message_id = (message.properties or {}).get("message_id")
        store, facts = self.store, None
        if message_id and store is not None:
            try:
                facts = message_facts(
                    queue,
                    message_id,
                    message.headers,
                    self.settings.message_ttl_ms,
                    wall_clock_ms(),
                    self.settings.scope_of(queue),
                )
                decision = store.reject(facts, reason, self.owner)
            except InvalidHeader:
                facts = None
            except Exception as exc:
                if not store_unavailable(exc):
                    raise
                logger.warning("beetle: cannot tell if %s was dead-lettered (%r)", message_id, exc)
                facts = None
            else:
                if decision.outcome is Rejected.DONE:
                    logger.warning(
                        "beetle: %s on queue %r (%s): dead-lettered already",
                        str(message_id)[:100],
                        queue,
                        reason,
                    )
                    return None
                if decision.outcome is Rejected.WAIT:
                    return decision.delay_ms / 1000
        dead_letter_delivery(c.app, message, queue, reason, detail, self.settings.scope_of(queue))
        if facts is not None and store is not None:
            try:
                store.dead_lettered(facts)
            except Exception as exc:  # stored on the broker: at worst a second dead letter
                logger.warning("beetle: cannot mark %s dead-lettered (%r)", message_id, exc)
        return None


def _prepare_metrics() -> None:
    """Before the pool forks: every process of this worker counts into shared files."""
    try:
        metrics.prepare_multiprocess()
    except ImportError as exc:
        raise ImproperlyConfigured(
            "celery_beetle: beetle_metrics_port is set but prometheus_client is not installed: "
            "pip install 'kombu-beetle[metrics]' (or unset beetle_metrics_port)"
        ) from exc
