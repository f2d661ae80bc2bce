"""Queue properties as RabbitMQ policies: one per queue, on every broker of the URL.

Queue arguments (``x-message-ttl``, ``x-dead-letter-routing-key``, ...) are frozen when a
queue is declared: changing one means deleting the queue, or a migration through a second
queue. Policies are not: RabbitMQ applies a changed policy to a live queue at once. So the
properties an operator may want to change are declared here and reach every broker as one
policy per queue, as XING's beetle does::

    name        beetle.<queue>
    pattern     ^<queue>$                       (that queue only)
    apply-to    queues
    priority    10                              (PolicyConfig.priority)
    definition  dead-letter-exchange: ""        (the default exchange: no shared DLX)
                dead-letter-routing-key: <queue>.dead
                message-ttl, max-length, max-length-bytes, overflow, delivery-limit,
                queue-version, expires          (only those configured)

Every broker-side dead letter (expired, rejected without requeue, overflowed, past a quorum
queue's delivery limit) so lands in that queue's own ``<queue>.dead`` on the broker that
held the copy, which the applier declares (a classic durable queue) where it is missing: a
dead-letter route to a queue that does not exist drops the message.

Configuration (:class:`PolicyConfig`, ``app.conf.beetle_queue_policies``)::

    {"default": {"message_ttl_ms": 86_400_000},
     "queues": {"orders": {"max_length": 100_000, "overflow": "reject-publish"}}}

A queue's properties are the default's, overridden by its own. Properties a policy cannot set
(``queue_type``, ``max_priority``) are refused: changing them needs a new queue, a migration.

Applying reads before it writes (one GET of the vhost's policies and one of its queues per
broker) and writes only what differs, so applying again is two GETs per broker and no PUT.
Workers apply in the background, one per fleet and round: :mod:`celery_beetle.ops.applier`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from celery_beetle.ops.management import ManagementClient, ManagementError
from celery_beetle.worker.deadletter import dead_letter_queue_name

__all__ = [
    "BrokerPlan",
    "Change",
    "Drift",
    "PolicyConfig",
    "QueueProperties",
    "apply",
    "desired_policy",
    "plan",
    "policy_name",
]


POLICY_PREFIX = "beetle."
DEFAULT_PRIORITY = 10

#: property -> its key in a policy definition
_PROPERTY_KEYS: dict[str, str] = {
    "message_ttl_ms": "message-ttl",
    "max_length": "max-length",
    "max_length_bytes": "max-length-bytes",
    "overflow": "overflow",
    "delivery_limit": "delivery-limit",
    "queue_version": "queue-version",
    "expires_ms": "expires",
}
_OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")
#: names a user may reach for that no policy can set
_NEEDS_MIGRATION = {
    "queue_type": "the queue type",
    "x-queue-type": "the queue type",
    "max_priority": "x-max-priority",
    "x-max-priority": "x-max-priority",
}
#: the x-argument that overrides each policy key when a queue was declared with it
_OVERRIDING_ARGUMENT = {
    "dead-letter-exchange": "x-dead-letter-exchange",
    "dead-letter-routing-key": "x-dead-letter-routing-key",
    **{key: f"x-{key}" for key in _PROPERTY_KEYS.values()},
}


@dataclass(frozen=True)
class QueueProperties:
    """The mutable properties of one queue; None: not set (the broker's default)."""

    message_ttl_ms: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str | None = None
    delivery_limit: int | None = None
    queue_version: int | None = None
    expires_ms: int | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "") -> QueueProperties:
        """From config; a clear ValueError for an unknown property or a bad value."""
        where = f" ({where})" if where else ""
        kwargs: dict[str, Any] = {}
        for name, value in values.items():
            if name in _NEEDS_MIGRATION:
                raise ValueError(
                    f"{name}{where}: a policy cannot change {_NEEDS_MIGRATION[name]}; it is "
                    "fixed when the queue is declared, so changing it means moving the queue's "
                    "messages to a new queue (a live queue migration: beetle queues migrate)"
                )
            if name not in _PROPERTY_KEYS:
                raise ValueError(
                    f"unknown queue property {name!r}{where}; known: {', '.join(_PROPERTY_KEYS)}"
                )
            if name == "overflow":
                if value not in _OVERFLOW:
                    raise ValueError(f"overflow={value!r}{where}: expected one of {_OVERFLOW}")
                kwargs[name] = value
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r}{where}: expected a whole number >= 0")
            if name == "queue_version" and value not in (1, 2):
                raise ValueError(f"queue_version={value!r}{where}: expected 1 or 2")
            kwargs[name] = value
        return cls(**kwargs)

    def merged(self, override: QueueProperties) -> QueueProperties:
        """These properties with every property set in ``override`` replaced."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(
            {
                f.name: getattr(override, f.name)
                for f in fields(override)
                if getattr(override, f.name) is not None
            }
        )
        return QueueProperties(**values)

    def policy_keys(self) -> dict[str, Any]:
        return {
            key: getattr(self, name)
            for name, key in _PROPERTY_KEYS.items()
            if getattr(self, name) is not None
        }


@dataclass(frozen=True)
class PolicyConfig:
    """What every managed queue should look like, on every broker."""

    default: QueueProperties = QueueProperties()
    queues: Mapping[str, QueueProperties] = field(default_factory=dict)
    priority: int = DEFAULT_PRIORITY

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> PolicyConfig:
        """From ``{"default": {...}, "queues": {name: {...}}, "priority": n}``."""
        values = dict(values or {})
        unknown = set(values) - {"default", "queues", "priority"}
        if unknown:
            raise ValueError(
                f"beetle_queue_policies: unknown key(s) {', '.join(sorted(unknown))} "
                "(expected default, queues, priority)"
            )
        default = QueueProperties.from_mapping(values.get("default") or {}, "default")
        queues = {
            str(name): QueueProperties.from_mapping(props or {}, str(name))
            for name, props in (values.get("queues") or {}).items()
        }
        priority = values.get("priority", DEFAULT_PRIORITY)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"beetle_queue_policies priority={priority!r}: expected an integer")
        return cls(default, queues, priority)

    def properties(self, queue: str) -> QueueProperties:
        own = self.queues.get(queue)
        return self.default.merged(own) if own is not None else self.default

    def fingerprint(self, queues: Iterable[str]) -> str:
        """A short hash of what this config asks of ``queues`` (names a fleet lock)."""
        wanted = {q: desired_policy(q, self) for q in sorted(set(queues))}
        return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]


#: what a quorum queue's delivery limit and the broker's consumer timeout do to beetle's
#: messages, said by ``beetle queues plan`` and ``migrate``
QUORUM_LIMITS_NOTE = (
    "  quorum queue {queue!r}: the broker counts deliveries against its delivery-limit "
    "(RabbitMQ 4: 20 unless a policy says otherwise; 3.x: none) and past it drops the "
    "message, unless a policy dead-letters it (beetle's send it to {queue}.dead). Workers "
    "replace a delivery counted 10 times by a fresh copy (beetle_delivery_renewal), so "
    "hand-backs, restarts and consumer timeouts (a channel holding a delivery past the "
    "broker's consumer_timeout, 30 min by default, is closed and gives it back counted "
    "once more) never reach it"
)


def policy_name(queue: str) -> str:
    return POLICY_PREFIX + queue


def desired_policy(queue: str, config: PolicyConfig) -> dict[str, Any]:
    """The policy body (as ``PUT /api/policies/{vhost}/{name}`` takes it) for ``queue``."""
    definition: dict[str, Any] = {
        "dead-letter-exchange": "",
        "dead-letter-routing-key": dead_letter_queue_name(queue),
        **config.properties(queue).policy_keys(),
    }
    return {
        "pattern": f"^{re.escape(queue)}$",
        "definition": definition,
        "priority": config.priority,
        "apply-to": "queues",
    }


@dataclass(frozen=True)
class Change:
    """One thing a broker lacks: ``kind`` is ``create`` or ``update`` (a policy) or
    ``declare`` (a dead-letter queue); ``before`` is what the broker has now."""

    broker: str
    kind: str
    name: str
    after: Mapping[str, Any]
    before: Mapping[str, Any] | None = None

    def describe(self) -> str:
        if self.kind == "declare":
            return f"{self.broker}: declare queue {self.name} (classic, durable)"
        if self.kind == "create":
            return f"{self.broker}: create policy {self.name} {_compact(self.after)}"
        return (
            f"{self.broker}: update policy {self.name}\n"
            f"    - {_compact(self.before or {})}\n    + {_compact(self.after)}"
        )


@dataclass(frozen=True)
class Drift:
    """Something the policy cannot fix, for the operator to know."""

    broker: str
    queue: str
    message: str

    def describe(self) -> str:
        return f"{self.broker}: {self.queue}: {self.message}"


def _compact(body: Mapping[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _comparable(policy: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "pattern": policy.get("pattern"),
        "definition": dict(policy.get("definition") or {}),
        "priority": policy.get("priority", 0),
        "apply-to": policy.get("apply-to", "all"),
    }


def plan_broker(
    broker: str,
    queues: Sequence[str],
    config: PolicyConfig,
    policies: Sequence[Mapping[str, Any]],
    existing_queues: Sequence[Mapping[str, Any]],
) -> tuple[list[Change], list[Drift]]:
    """What ``broker`` (its ``policies`` and ``existing_queues``, as the API lists them)
    lacks for ``queues``, and the drift no policy can fix. Pure: no I/O."""
    by_name = {p["name"]: p for p in policies}
    queue_info = {q["name"]: q for q in existing_queues}
    changes: list[Change] = []
    drift: list[Drift] = []
    for queue in queues:
        name = policy_name(queue)
        wanted = desired_policy(queue, config)
        current = by_name.get(name)
        if current is None:
            changes.append(Change(broker, "create", name, wanted))
        elif _comparable(current) != wanted:
            changes.append(Change(broker, "update", name, wanted, _comparable(current)))
        dead = dead_letter_queue_name(queue)
        if dead not in queue_info:
            changes.append(Change(broker, "declare", dead, {"durable": True}))
        drift += _drift(broker, queue, wanted, queue_info.get(queue), policies, config)
        drift += _quorum_limits(broker, queue, queue_info.get(queue), config)
    return changes, drift


def _quorum_limits(
    broker: str, queue: str, info: Mapping[str, Any] | None, config: PolicyConfig
) -> list[Drift]:
    """What a quorum queue's delivery limit and the consumer timeout mean here, when the
    configuration leaves the limit to the broker."""
    if info is None or info.get("type") != "quorum":
        return []
    if config.properties(queue).delivery_limit is not None:
        return []
    return [Drift(broker, queue, QUORUM_LIMITS_NOTE.format(queue=queue).strip())]


def _drift(
    broker: str,
    queue: str,
    wanted: Mapping[str, Any],
    info: Mapping[str, Any] | None,
    policies: Sequence[Mapping[str, Any]],
    config: PolicyConfig,
) -> list[Drift]:
    found: list[Drift] = []
    if info is not None:
        arguments = info.get("arguments") or {}
        for key, value in wanted["definition"].items():
            argument = _OVERRIDING_ARGUMENT.get(key)
            if argument in arguments and arguments[argument] != value:
                found.append(
                    Drift(
                        broker,
                        queue,
                        f"declared with {argument}={arguments[argument]!r}, which wins over "
                        f"the policy's {key}={value!r} (client arguments beat policies)",
                    )
                )
        effective = info.get("policy")
        if effective and effective != policy_name(queue):
            found.append(Drift(broker, queue, f"policy {effective!r} applies, not ours"))
    for policy in policies:
        if policy.get("name") == policy_name(queue):
            continue
        if policy.get("apply-to", "all") not in ("all", "queues"):
            continue
        if int(policy.get("priority", 0)) < config.priority:
            continue
        try:
            matches = re.search(str(policy.get("pattern", "")), queue) is not None
        except re.error:
            continue
        if matches:
            found.append(
                Drift(
                    broker,
                    queue,
                    f"policy {policy['name']!r} (priority {policy.get('priority', 0)}) matches "
                    f"it too and {_shadows(int(policy.get('priority', 0)), config.priority)} "
                    "ours: RabbitMQ applies one policy per queue",
                )
            )
    return found


def _shadows(theirs: int, ours: int) -> str:
    return "shadows" if theirs > ours else "ties with (RabbitMQ picks either)"


@dataclass
class BrokerPlan:
    """One broker's part of a plan; ``error`` when its API could not be read."""

    broker: str
    changes: list[Change] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    error: str | None = None
    writes: int = 0


def plan(
    clients: Sequence[ManagementClient], queues: Sequence[str], config: PolicyConfig
) -> list[BrokerPlan]:
    """The difference between ``config`` and each broker, read with two GETs per broker."""
    result = []
    for client in clients:
        try:
            changes, drift = plan_broker(
                client.name, queues, config, client.policies(), client.queues()
            )
        except ManagementError as exc:
            result.append(BrokerPlan(client.name, error=str(exc)))
            continue
        result.append(BrokerPlan(client.name, changes, drift))
    return result


def apply(
    clients: Sequence[ManagementClient], queues: Sequence[str], config: PolicyConfig
) -> list[BrokerPlan]:
    """Make every reachable broker match ``config``: GET, then PUT only what differs.

    An unreachable broker is reported in its :class:`BrokerPlan`, never raised: the others
    still get their policies."""
    plans = plan(clients, queues, config)
    for client, broker_plan in zip(clients, plans, strict=True):
        if broker_plan.error is not None:
            continue
        before = client.writes
        try:
            for change in broker_plan.changes:
                if change.kind == "declare":
                    client.declare_queue(change.name)
                else:
                    client.put_policy(change.name, change.after)
        except ManagementError as exc:
            broker_plan.error = str(exc)
        broker_plan.writes = client.writes - before
    return plans
