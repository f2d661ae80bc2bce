"""Worker-side settings: the dedup store's URL and the retry limits, app-wide and per task.

Read from the Celery app's configuration (``app.conf``):

==============================  =====================================================
``beetle_redis_url``            the dedup store (required): ``redis://``, ``rediss://``,
                                ``redis+sentinel://`` or ``redis+cluster://``; the
                                forms are below
``beetle_trace_dir``            where trace events go (unset: no tracing)
``beetle_default_timeout``      lease per run, seconds (300)
``beetle_default_attempts``     most runs of a message, crashes included (1)
``beetle_default_exceptions``   exceptions tolerated; at most attempts - 1 (0)
``beetle_default_retry_delay``  wait before the first retry, seconds; doubles (10).
                                ``beetle_default_delay`` is its deprecated alias
``beetle_default_max_delay``    cap on that wait, seconds (600)
``beetle_default_retry_on``     exception classes (or dotted names) worth a retry
                                (all ``Exception``)
``beetle_message_ttl``          expiry of a message without ``x-beetle-expires-at``,
                                seconds (86400)
``beetle_key_ttl_margin``       how long a record outlives its message, seconds (3600)
``beetle_key_prefix``           prefix of the Redis keys (``beetle:``)
``beetle_redis_wait_replicas``  replicas that must acknowledge every write before it
                                counts as stored (0: none; not for Cluster)
``beetle_dedup_scopes``         ``{queue: scope}`` (or ``"q1=s1,q2=s2"``): queues
                                whose messages are deduplicated under another name,
                                e.g. the old and new queue of a migration under one
                                scope; a queue not named is its own scope
``beetle_metrics_port``         serve Prometheus metrics on this port from the
                                worker's main process (unset: none; see
                                ``celery_beetle.metrics``)
``beetle_metrics_addr``         the address to serve them on (``0.0.0.0``)
``beetle_delivery_renewal``     a delivery a quorum queue has counted this often
                                (``x-delivery-count``) is replaced by a fresh copy
                                on its broker, so no ``delivery-limit`` drops it
                                (10; 0: never)
``beetle_shutdown_store_wait``  how long a worker's warm shutdown keeps trying to
                                store the completions it owes while Redis is down,
                                seconds (30)
==============================  =====================================================

``beetle_dead_letter_retention``: how long the record of a message given up (its dead letter
stored) is kept at least, seconds (30 days), as its dead letter may wait that long in
``<queue>.dead``: a replay proves from it that the message never completed
(``celery_beetle.store.outcome.decide_replay``). One small hash per dead letter.

The dedup store's URL (``beetle_redis_url``) takes the forms of
:mod:`celery_beetle.store.address` (Redis, Sentinel or Cluster, each with or without TLS),
checked here so that a typo stops the worker before its first message.

A task overrides the limits with its own ``timeout``, ``attempts``, ``exceptions``,
``retry_delay``, ``max_delay`` and ``retry_on`` (:data:`TASK_OPTIONS`, applied by
``celery_beetle.task.resolve_settings``). The limits follow beetle: a message runs at most
``attempts`` times, and gives up at the ``exceptions + 1``-th exception, so ``exceptions``
above ``attempts - 1`` could never take effect and is refused.

``delay`` was the first name of ``retry_delay``; it collides with Celery's ``Task.delay()``
method, so it is deprecated: the task option ``delay=``, ``with_options(delay=...)`` and the
setting ``beetle_default_delay`` still work, with a :class:`DeprecationWarning`. Given together
with the new name and a different value, they are refused rather than one silently winning.

:May import: ``kombu_beetle``, ``celery_beetle.store``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_beetle.store.address import EXPECTED_URL_FORMS, StoreAddress, parse_store_url
from celery_beetle.store.decisions import Limits
from kombu_beetle.envelope import MAX_MESSAGE_LIFE_S
from kombu_beetle.scopes import parse_dedup_scopes, scope_of
from kombu_beetle.urls import mask_url

__all__ = [
    "APP_SETTINGS",
    "DEPRECATED_OPTIONS",
    "EXPECTED_URL_FORMS",
    "SETTING_DEFAULTS_SHOWN",
    "SETTING_DOCS",
    "TASK_OPTIONS",
    "BeetleSettings",
    "StoreAddress",
    "mask_url",
    "parse_store_url",
    "take_deprecated",
]

#: The documented task option names -> settings fields: the one map of task options. A task
#: sets them as attributes of the same name; ``beetle_default_<name>`` is the app-wide default.
TASK_OPTIONS: Mapping[str, str] = {
    "timeout": "lease_timeout_s",
    "attempts": "attempts",
    "exceptions": "exceptions",
    "retry_delay": "delay_s",
    "max_delay": "max_delay_s",
    "retry_on": "retry_on",
}

_APP_OPTIONS: Mapping[str, str] = {
    "beetle_redis_url": "redis_url",
    "beetle_trace_dir": "trace_dir",
    "beetle_message_ttl": "message_ttl_s",
    "beetle_key_ttl_margin": "key_ttl_margin_s",
    "beetle_dead_letter_retention": "dead_letter_retention_s",
    "beetle_key_prefix": "key_prefix",
    "beetle_redis_wait_replicas": "redis_wait_replicas",
    "beetle_max_deferred": "max_deferred",
    "beetle_max_deferred_bytes": "max_deferred_bytes",
    "beetle_unknown_task_grace": "unknown_task_grace_s",
    "beetle_delivery_renewal": "delivery_renewal",
    "beetle_shutdown_store_wait": "shutdown_store_wait_s",
    "beetle_claim_in_idle_pool": "claim_in_idle_pool",
    "beetle_dedup_scopes": "dedup_scopes",
    "beetle_metrics_port": "metrics_port",
    "beetle_metrics_addr": "metrics_addr",
    **{f"beetle_default_{name}": attr for name, attr in TASK_OPTIONS.items()},
}

#: Deprecated option names -> the documented ones, still accepted with a DeprecationWarning.
#: ``delay`` shadowed Celery's ``Task.delay()`` method.
DEPRECATED_OPTIONS: Mapping[str, str] = {"delay": "retry_delay"}

SECRET, PLAIN = True, False

#: Every ``app.conf`` setting of the project -> whether its value can hold a credential (a
#: password in a URL or a DSN, a password option). Celery's reports mask the secret ones
#: (:mod:`celery_beetle.censor`); a test fails for a setting read anywhere but missing here.
APP_SETTINGS: Mapping[str, bool] = {
    # the worker's gate and the dedup store (this module)
    **dict.fromkeys(_APP_OPTIONS, PLAIN),
    **{f"beetle_default_{old}": PLAIN for old in DEPRECATED_OPTIONS},
    "beetle_redis_url": SECRET,
    # the outbox (:mod:`celery_beetle.outbox`): a database URL
    "beetle_outbox_db": SECRET,
    "beetle_outbox_listen": PLAIN,
    "beetle_outbox_notify": PLAIN,
    # queue policies (:mod:`celery_beetle.ops.worker`): the management API's password and URLs
    "beetle_queue_policies": PLAIN,
    "beetle_management": SECRET,
    "beetle_policy_interval": PLAIN,
}

#: What each setting of :data:`APP_SETTINGS` is for, one line each (`code` in backticks). The
#: docs' settings reference (``docs/_ext/beetle_settings.py``) renders it with the setting's
#: default and whether it is secret; the docs build and ``tests/unit/test_docs.py`` fail for
#: a setting of :data:`APP_SETTINGS` missing here.
SETTING_DOCS: Mapping[str, str] = {
    "beetle_redis_url": "the dedup store: `redis://`, `rediss://`, `unix://`, "
    "`redis+sentinel://h:p[,h:p]/service[/db]`, `redis+cluster://h:p[,…]` "
    "(`rediss+…` for TLS)",
    "beetle_default_timeout": "the lease per run, seconds; the hard time limit is derived from "
    "it so that two runs never overlap",
    "beetle_default_attempts": "how many times a message's body may begin (a claim whose body "
    "never began counts none)",
    "beetle_default_exceptions": "how many failures are retried (at most `attempts - 1`)",
    "beetle_default_retry_delay": "wait before the first retry, seconds; doubles per failure "
    "(`retry_delay * 2**n`)",
    "beetle_default_delay": "deprecated alias of `beetle_default_retry_delay` (it warns)",
    "beetle_default_max_delay": "cap on the retry wait, seconds",
    "beetle_default_retry_on": "exception classes (or dotted names) worth a retry; others "
    "dead-letter at once",
    "beetle_trace_dir": "trace events for `beetle audit` (set it before `install()`; "
    "publishers of a `beetle://` app trace too)",
    "beetle_message_ttl": "expiry of a BeetleTask message without `x-beetle-expires-at`, "
    "seconds; at most 366 days",
    "beetle_key_ttl_margin": "how long a record outlives its message's expiry, seconds",
    "beetle_dead_letter_retention": "how long the record of a message given up (its dead "
    "letter stored) is kept at least, seconds, so that `beetle dead replay` can prove it "
    "never completed; one small hash per dead letter",
    "beetle_key_prefix": "prefix of the Redis keys (no braces: they mark the Cluster hash tag)",
    "beetle_redis_wait_replicas": "replicas that must acknowledge each claim, completion, "
    "failure and release (Redis `WAIT n 1000`) before it counts as stored; not for Cluster",
    "beetle_max_deferred": "deferred copies that widen the prefetch window; past it a deferred "
    "copy still waits, but the brokers send this worker nothing new until some resolve",
    "beetle_max_deferred_bytes": "the same bound on the deferred copies' body bytes",
    "beetle_unknown_task_grace": "how long an unknown task is handed back for a worker that "
    "knows it (a rolling deploy), seconds, before it is dead-lettered",
    "beetle_delivery_renewal": "a delivery whose quorum queue has counted this many "
    "deliveries of it (`x-delivery-count`) is replaced by a fresh copy on the same broker, so "
    "no queue's `delivery-limit` (20 by default from RabbitMQ 4.0) drops it; 0: never",
    "beetle_shutdown_store_wait": "how long a warm shutdown (SIGTERM) keeps trying to store "
    "the completions of bodies that returned, while Redis is down, before the worker lets "
    "their messages go back unacked, seconds",
    "beetle_claim_in_idle_pool": "under prefork a fresh delivery waits in the gate until a pool "
    "process is free, and the gate's claim for it starts the run (no Redis call in the pool "
    "process before the body); False: the gate reserves every delivery first",
    "beetle_dedup_scopes": '`{queue: scope}` or `"q1=s1,q2=s2"`: the dedup scope of messages '
    "consumed from a queue (the old and new queue of a migration share one)",
    "beetle_metrics_port": "serve Prometheus metrics on this port from the worker's main process",
    "beetle_metrics_addr": "the address to serve the metrics on",
    "beetle_outbox_db": "the outbox's database URL, for the relay inside workers "
    "(`celery_beetle.outbox.install_relay`)",
    "beetle_outbox_listen": "the relay inside workers wakes on NOTIFY as well as polling",
    "beetle_outbox_notify": "each outbox enqueue also runs `pg_notify('beetle_outbox', '')` "
    "in its transaction",
    "beetle_queue_policies": '`{"default": {...}, "queues": {name: {...}}, "priority": n}`: '
    "the properties of the `beetle.<queue>` policies the workers keep applied",
    "beetle_management": "where each broker's management API is: `port`, `scheme`, `user`, "
    "`password`, `verify`, `timeout_s`, `urls`",
    "beetle_policy_interval": "seconds between two rounds of the policy applier",
}

#: The defaults the settings reference shows for settings whose default
#: :class:`BeetleSettings` does not hold (read elsewhere, or with no field default).
SETTING_DEFAULTS_SHOWN: Mapping[str, str] = {
    "beetle_redis_url": "required",
    "beetle_default_delay": "—",
    "beetle_dedup_scopes": "each queue its own",
    "beetle_trace_dir": "off",
    "beetle_metrics_port": "off",
    "beetle_outbox_db": "off",
    "beetle_outbox_listen": "False",
    "beetle_outbox_notify": "False",
    "beetle_queue_policies": "off",
    "beetle_management": "port 15672 on each broker's host, the URL's credentials",
    "beetle_policy_interval": "30 s",
}

RetryOn = tuple[type[BaseException] | str, ...]


@dataclass(frozen=True, repr=False)
class BeetleSettings:
    """Validated settings; build with :meth:`from_app`, narrow per task with :meth:`with_options`.

    ``retry_on`` accepts classes and dotted names (``"requests.ConnectionError"``): names are
    imported here, so a typo fails at worker start, not at the first exception.
    """

    redis_url: str
    lease_timeout_s: float = 300.0
    attempts: int = 1
    exceptions: int = 0
    delay_s: float = 10.0
    max_delay_s: float = 600.0
    retry_on: RetryOn = (Exception,)
    message_ttl_s: float = 86_400.0
    key_ttl_margin_s: float = 3_600.0
    dead_letter_retention_s: float = 30 * 86_400.0
    key_prefix: str = "beetle:"
    redis_wait_replicas: int = 0
    max_deferred: int = 1_000
    max_deferred_bytes: int = 64 * 1024 * 1024
    unknown_task_grace_s: float = 600.0
    delivery_renewal: int = 10
    shutdown_store_wait_s: float = 30.0
    claim_in_idle_pool: bool = True
    trace_dir: str | None = None
    #: ``{physical queue: dedup scope}`` (``kombu_beetle.scopes``)
    dedup_scopes: Mapping[str, str] = field(default_factory=dict)
    #: the worker serves Prometheus metrics on this port (None: no metrics)
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    retry_on_classes: tuple[type[BaseException], ...] = field(init=False, compare=False, default=())

    def __post_init__(self) -> None:
        if not self.redis_url:
            raise ValueError(
                "no Redis URL for the dedup store: set app.conf.beetle_redis_url, "
                "e.g. 'redis://localhost:6379/0'"
            )
        address = parse_store_url(self.redis_url)
        for name in (
            "lease_timeout_s",
            "delay_s",
            "max_delay_s",
            "message_ttl_s",
            "key_ttl_margin_s",
            "unknown_task_grace_s",
            "dead_letter_retention_s",
            "shutdown_store_wait_s",
        ):
            value = getattr(self, name)
            _require(
                isinstance(value, (int, float)) and not isinstance(value, bool),
                f"{name} must be a number of seconds, got {value!r}",
            )
        for name in ("lease_timeout_s", "message_ttl_s", "key_ttl_margin_s"):
            value = getattr(self, name)
            _require(value > 0, f"{name} must be a positive number of seconds, got {value!r}")
        _require(
            self.message_ttl_s <= MAX_MESSAGE_LIFE_S,
            f"message_ttl_s must be at most {MAX_MESSAGE_LIFE_S // 86_400} days, "
            f"got {self.message_ttl_s!r}",
        )
        _require(
            self.dead_letter_retention_s >= 0,
            f"dead_letter_retention_s must be 0 or more seconds, "
            f"got {self.dead_letter_retention_s!r}",
        )
        _require(
            self.shutdown_store_wait_s >= 0,
            f"shutdown_store_wait_s must be 0 or more seconds, got {self.shutdown_store_wait_s!r}",
        )
        _require(
            self.unknown_task_grace_s >= 0,
            f"unknown_task_grace_s must be 0 or more seconds, got {self.unknown_task_grace_s!r}",
        )
        for name in ("max_deferred", "max_deferred_bytes", "delivery_renewal"):
            value = getattr(self, name)
            _require(
                _is_int(value) and value >= 0,
                f"{name} must be an integer of at least 0, got {value!r}",
            )
        _require(
            isinstance(self.claim_in_idle_pool, bool),
            f"claim_in_idle_pool must be True or False, got {self.claim_in_idle_pool!r}",
        )
        _require(
            _is_int(self.attempts) and self.attempts >= 1,
            f"attempts must be an integer of at least 1 (the first run counts), "
            f"got {self.attempts!r}",
        )
        _require(
            _is_int(self.exceptions) and self.exceptions >= 0,
            f"exceptions must be an integer of at least 0, got {self.exceptions!r}",
        )
        _require(
            self.exceptions <= self.attempts - 1,
            f"exceptions={self.exceptions} cannot take effect with attempts={self.attempts}: "
            f"every tolerated exception needs another attempt, so set attempts to at least "
            f"{self.exceptions + 1} or exceptions to at most {self.attempts - 1}",
        )
        _require(self.delay_s >= 0, f"delay_s must be 0 or more seconds, got {self.delay_s!r}")
        _require(
            self.max_delay_s >= self.delay_s,
            f"max_delay_s ({self.max_delay_s!r}) is less than delay_s ({self.delay_s!r}): "
            f"raise max_delay_s or lower delay_s",
        )
        _require(
            _is_int(self.redis_wait_replicas) and self.redis_wait_replicas >= 0,
            f"redis_wait_replicas must be an integer of at least 0, "
            f"got {self.redis_wait_replicas!r}",
        )
        _require(
            not (self.redis_wait_replicas and address.kind == "cluster"),
            "redis_wait_replicas is not supported on Redis Cluster: set it to 0, or use a "
            "redis:// or redis+sentinel:// URL",
        )
        _require(
            "{" not in self.key_prefix and "}" not in self.key_prefix,
            f"key_prefix {self.key_prefix!r} must not contain braces: they mark the "
            f"Redis Cluster hash tag of each key",
        )
        _require(
            self.metrics_port is None
            or (_is_int(self.metrics_port) and 0 <= self.metrics_port <= 65535),
            f"metrics_port must be a TCP port (0 to 65535) or None, got {self.metrics_port!r}",
        )
        _require(
            isinstance(self.metrics_addr, str) and bool(self.metrics_addr),
            f"metrics_addr must be an address to listen on, e.g. '0.0.0.0', "
            f"got {self.metrics_addr!r}",
        )
        object.__setattr__(self, "dedup_scopes", parse_dedup_scopes(self.dedup_scopes))
        retry_on = _as_tuple(self.retry_on)
        object.__setattr__(self, "retry_on", retry_on)
        object.__setattr__(self, "retry_on_classes", tuple(_resolve(c) for c in retry_on))

    def __repr__(self) -> str:
        shown = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "retry_on_classes"
        }
        shown["redis_url"] = mask_url(self.redis_url)
        return f"BeetleSettings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @classmethod
    def from_app(cls, app: Any) -> BeetleSettings:
        """Settings from ``app.conf`` (names in the module docstring); unset ones keep defaults."""
        conf = app.conf
        names = {name: conf.get(name) for name in _APP_OPTIONS}
        for old, new in DEPRECATED_OPTIONS.items():
            old_name, new_name = f"beetle_default_{old}", f"beetle_default_{new}"
            names[new_name] = take_deprecated(names, old_name, new_name, conf.get(old_name))
        values = {attr: names[name] for name, attr in _APP_OPTIONS.items()}
        values["redis_url"] = values["redis_url"] or ""
        return cls(**{attr: value for attr, value in values.items() if value is not None})

    @property
    def limits(self) -> Limits:
        """The limits in the milliseconds the store and its scripts take."""
        return Limits(
            lease_timeout_ms=round(self.lease_timeout_s * 1000),
            attempts=self.attempts,
            exceptions=self.exceptions,
            delay_ms=round(self.delay_s * 1000),
            max_delay_ms=round(self.max_delay_s * 1000),
        )

    def scope_of(self, queue: str) -> str:
        """The dedup scope of messages consumed from ``queue``."""
        return scope_of(self.dedup_scopes, queue)

    @property
    def message_ttl_ms(self) -> int:
        return round(self.message_ttl_s * 1000)

    @property
    def key_ttl_margin_ms(self) -> int:
        return round(self.key_ttl_margin_s * 1000)

    @property
    def dead_letter_retention_ms(self) -> int:
        return round(self.dead_letter_retention_s * 1000)

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether ``exc`` is one of ``retry_on``: the ``retryable`` flag of a failure."""
        return isinstance(exc, self.retry_on_classes)

    def with_options(self, **options: Any) -> BeetleSettings:
        """These settings with task options (the names of
        :data:`~celery_beetle.settings.TASK_OPTIONS`) over them; None keeps the default.
        ``delay`` is taken for ``retry_delay``, with a warning."""
        for old, new in DEPRECATED_OPTIONS.items():
            if old in options:
                options[new] = take_deprecated(options, old, new, options.pop(old))
        unknown = set(options) - set(TASK_OPTIONS)
        if unknown:
            raise TypeError(
                f"unknown beetle task option(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(TASK_OPTIONS)}"
            )
        changes = {TASK_OPTIONS[k]: v for k, v in options.items() if v is not None}
        return dataclasses.replace(self, **changes) if changes else self


def take_deprecated(values: Mapping[str, Any], old: str, new: str, old_value: Any) -> Any:
    """The value for ``new`` when a deprecated name ``old`` was given ``old_value``.

    Warns when ``old`` is used (None counts as unset). Both names with different values are
    refused: silently preferring one would run a task with a delay its author did not mean.
    """
    new_value = values.get(new)
    if old_value is None:
        return new_value
    warnings.warn(
        f"{old!r} is deprecated: use {new!r} (Celery's Task.delay() is a method)",
        DeprecationWarning,
        stacklevel=3,
    )
    if new_value is not None and new_value != old_value:
        raise ValueError(
            f"{old}={old_value!r} and {new}={new_value!r} disagree: {old!r} is the "
            f"deprecated name of {new!r}, so set only {new!r}"
        )
    return old_value


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_tuple(retry_on: Any) -> RetryOn:
    if isinstance(retry_on, (str, type)):
        return (retry_on,)
    return tuple(retry_on)


def _resolve(spec: type[BaseException] | str) -> type[BaseException]:
    """A class from ``retry_on``: as given, or imported from its dotted name."""
    cls: Any = spec
    if isinstance(spec, str):
        module_name, _, name = spec.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name or "builtins"), name)
        except (ImportError, AttributeError, ValueError):
            raise ValueError(
                f"retry_on names {spec!r}, which cannot be imported: give the class or its "
                f"full dotted name, e.g. 'requests.exceptions.ConnectionError'"
            ) from None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise ValueError(f"retry_on must hold exception classes, got {spec!r}")
    return cls
