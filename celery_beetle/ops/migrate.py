"""Live queue migration: change what no policy can (queue type, ``x-max-priority``, any
x-argument) on every broker, while publishers publish and workers consume.

RabbitMQ cannot change a queue's arguments nor rename a queue, so the queue is emptied into
a temporary queue, deleted, declared again with the new arguments (same name: publishers
change nothing) and filled back. Done by hand that took four releases; here it is one
command, made safe by two things this project already has:

* the temporary queue ``<queue>.beetle-migrating`` shares the dedup scope of ``<queue>``
  (:func:`kombu_beetle.scopes.scope_of`), so a message with copies in both (or moved twice
  after a crash) runs once, and its retries and dead letters go to ``<queue>``'s delay and
  dead-letter queues (:func:`kombu_beetle.scopes.home_queue`);
* every task message sits on two brokers, and the migration does one broker at a time: a
  copy published to the broker being migrated in the instant its queue does not exist is
  dropped by that broker, and its twin on another broker runs it.

Steps (each one idempotent, the state saved after each, so a ``kill -9`` anywhere and
``--resume`` completes it)::

    planned        declare <queue>.beetle-migrating on every broker; tell the workers
                   (Celery's remote control, ``add_consumer``) to consume it too
    per broker, one after the other:
      pending      save <queue>'s bindings; move its ready messages to the temporary
                   queue (acked once confirmed); delete <queue> if empty, else move again
      drained      declare <queue> with the new arguments and its bindings; if a worker
                   re-declared it with the old ones meanwhile, drain again
      recreated    move the temporary queue's messages back
      moved-back
    temp-consumed  tell the workers to stop consuming the temporary queue (``cancel_consumer``)
    temp-released  move what is left back, delete the temporary queues once empty
    done

Both queues are consumed during each overlap: workers consume ``<queue>`` and, from the first
step to the last, ``<queue>.beetle-migrating``.

A broker that is down when the migration starts: it refuses, naming the broker (a migration
half applied to a fleet is harder to reason about than one not started). A broker that goes
down during the migration stops it with the state saved; ``--resume`` goes on from the step
it stopped at once the broker is back.

The state lives in the dedup store (Redis), under ``<prefix>ops:migration:<vhost>:<queue>``,
so ``--status`` and ``--resume`` work from any machine of the fleet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import amqp

from celery_beetle.ops.management import ManagementClient, ManagementError
from celery_beetle.ops.migration_state import (
    BROKER_STEPS,
    PHASES,
    MigrationError,
    MigrationLock,
    MigrationState,
    StateStore,
)
from celery_beetle.ops.mover import BrokerSession, open_session
from kombu_beetle.options import BeetleOptions

__all__ = [
    "BROKER_STEPS",
    "PHASES",
    "CeleryControl",
    "MigrationError",
    "MigrationLock",
    "MigrationState",
    "Migrator",
    "StateStore",
    "WorkerControl",
    "parse_arguments",
    "target_arguments",
]

#: a drain races workers re-declaring the queue at most this often before it gives up
MAX_DRAIN_ROUNDS = 20
#: arguments a quorum queue refuses (RabbitMQ 3.x)
_NOT_FOR_QUORUM = ("x-max-priority", "x-queue-mode", "x-queue-master-locator")


class WorkerControl(Protocol):
    """Tells the workers to consume a queue, or to stop (Celery's remote control)."""

    def add_consumer(self, queue: str) -> list[str]: ...

    def cancel_consumer(self, queue: str) -> list[str]: ...


def parse_arguments(items: Sequence[str]) -> dict[str, Any]:
    """``["x-max-priority=10", "x-queue-mode="]`` -> ``{"x-max-priority": 10,
    "x-queue-mode": None}`` (None: remove it). Whole numbers become ints."""
    parsed: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("x-"):
            raise ValueError(f"{item!r}: expected x-NAME=VALUE (x-NAME= to remove an argument)")
        if value == "":
            parsed[name] = None
        elif value.lstrip("-").isdigit():
            parsed[name] = int(value)
        else:
            parsed[name] = value
    return parsed


def target_arguments(
    current: Mapping[str, Any], queue_type: str | None, changes: Mapping[str, Any]
) -> dict[str, Any]:
    """The arguments the queue is declared with again: its ``current`` ones, with the type
    and ``changes`` applied. A ValueError when RabbitMQ would refuse them."""
    wanted = {k: v for k, v in current.items() if k != "x-queue-type"}
    for name, value in changes.items():
        if value is None:
            wanted.pop(name, None)
        else:
            wanted[name] = value
    kind = queue_type or changes.get("x-queue-type") or current.get("x-queue-type")
    if kind and kind != "classic":
        wanted["x-queue-type"] = kind
    if kind == "quorum":
        refused = [name for name in _NOT_FOR_QUORUM if name in wanted]
        if refused:
            raise ValueError(
                f"a quorum queue takes no {', '.join(refused)}: drop "
                + " ".join(f"--arg {name}=" for name in refused)
            )
    return wanted


class Migrator:
    """Carries a :class:`MigrationState` to ``done`` over the brokers of ``options``."""

    def __init__(
        self,
        options: BeetleOptions,
        clients: Sequence[ManagementClient],
        store: StateStore,
        control: WorkerControl | None,
        echo: Callable[[str], None] = print,
        session_for: Callable[[BeetleOptions, Any], BrokerSession] = open_session,
        settle_s: float = 5.5,
        release_timeout_s: float = 120.0,
    ) -> None:
        #: the management API samples queue figures every 5 s (collect_statistics_interval)
        self.settle_s = settle_s
        self.release_timeout_s = release_timeout_s
        self.options = options
        self.clients = {c.name: c for c in clients}
        self.store = store
        self.control = control
        self.echo = echo
        self.session_for = session_for

    # -- starting ----------------------------------------------------------------------------

    def plan(
        self, queue: str, queue_type: str | None, changes: Mapping[str, Any]
    ) -> MigrationState:
        """Read every broker (all must answer) and build the state a run would start from."""
        infos: dict[str, dict[str, Any] | None] = {}
        for name, client in self.clients.items():
            try:
                infos[name] = client.queue(queue)
            except ManagementError as exc:
                raise MigrationError(
                    f"broker {name} does not answer ({exc}); a migration starts only with "
                    "every broker up: start it again once it is back"
                ) from exc
        found = [info for info in infos.values() if info is not None]
        if not found:
            raise MigrationError(f"queue {queue!r} exists on no broker of the vhost")
        try:
            arguments = target_arguments(found[0].get("arguments") or {}, queue_type, changes)
        except ValueError as exc:
            raise MigrationError(str(exc)) from exc
        return MigrationState(queue, self.options.virtual_host, arguments, list(self.clients))

    def describe_plan(self, state: MigrationState) -> str:
        lines = [
            f"migrate {state.queue!r} on {len(state.brokers)} broker(s), one at a time, "
            f"to arguments {json.dumps(state.arguments, sort_keys=True)}:"
        ]
        for name, client in self.clients.items():
            info = client.queue(state.queue) or {}
            lines.append(
                f"  {name}: now {info.get('type', '?')} "
                f"{json.dumps(info.get('arguments') or {}, sort_keys=True)}, "
                f"{info.get('messages', '?')} message(s), {info.get('consumers', '?')} consumer(s)"
            )
        lines += [
            f"  1. declare {state.temp} on every broker; workers consume it too",
            f"  2. per broker: move {state.queue} -> {state.temp}, delete {state.queue}, "
            f"declare it with the new arguments and its bindings, move back",
            f"  3. workers stop consuming {state.temp}; it is emptied into "
            f"{state.queue} and deleted",
        ]
        return "\n".join(lines)

    # -- running -----------------------------------------------------------------------------

    def run(self, state: MigrationState) -> MigrationState:
        if state.phase == "planned":
            self._declare_temp(state)
            if self.control is not None:
                state.workers = self.control.add_consumer(state.temp)
                self.echo(f"{len(state.workers)} worker(s) consume {state.temp}")
            self._advance(state, phase="temp-consumed")
        if state.phase == "temp-consumed":
            for broker in state.brokers:
                self._migrate_broker(state, broker)
            if self.control is not None:
                self.control.cancel_consumer(state.temp)
                self.echo(f"workers told to stop consuming {state.temp}")
            self._advance(state, phase="temp-released")
        if state.phase == "temp-released":
            for broker in state.brokers:
                self._release_temp(state, broker)
            self._advance(state, phase="done")
        return state

    def _advance(self, state: MigrationState, *, phase: str | None = None,
                 broker: str | None = None, step: str | None = None) -> None:  # fmt: skip
        if phase is not None:
            state.phase = phase
            self.echo(f"{state.queue}: {phase}")
        if broker is not None and step is not None:
            state.steps[broker] = step
            self.echo(f"{broker}: {state.queue} {step}")
        self.store.save(state)

    def _session(self, broker: str) -> BrokerSession:
        address = next(b for b in self.options.all_brokers if b.name == broker)
        try:
            return self.session_for(self.options, address)
        except Exception as exc:
            raise MigrationError(
                f"broker {broker} is unreachable ({exc!r}); the migration stopped with its "
                "state saved: run it again with --resume once the broker is back"
            ) from exc

    def _declare_temp(self, state: MigrationState) -> None:
        for broker in state.brokers:
            session = self._session(broker)
            try:
                session.channel.queue_declare(queue=state.temp, durable=True, auto_delete=False)
            finally:
                session.close()

    def _migrate_broker(self, state: MigrationState, broker: str) -> None:
        if state.steps[broker] == "moved-back":
            return
        session = self._session(broker)
        try:
            while state.steps[broker] != "moved-back":
                step = state.steps[broker]
                if step == "pending":
                    self._drain(state, broker, session)
                    self._advance(state, broker=broker, step="drained")
                elif step == "drained":
                    if self._recreate(state, broker, session):
                        self._advance(state, broker=broker, step="recreated")
                    else:  # re-declared with the old arguments meanwhile: again
                        self._advance(state, broker=broker, step="pending")
                elif step == "recreated":
                    state.moved[broker][1] += session.move(state.temp, state.queue)
                    self._advance(state, broker=broker, step="moved-back")
        except (amqp.ConnectionError, OSError) as exc:
            raise MigrationError(
                f"broker {broker} failed during step {state.steps[broker]!r} ({exc!r}); "
                "the state is saved: run again with --resume once it is back"
            ) from exc
        finally:
            session.close()

    def _drain(self, state: MigrationState, broker: str, session: BrokerSession) -> None:
        if session.depth(state.queue) is None:
            return  # deleted before a crash: its messages are in the temporary queue
        if broker not in state.bindings:
            state.bindings[broker] = self.clients[broker].queue_bindings(state.queue)
            self.store.save(state)
        info = self.clients[broker].queue(state.queue) or {}
        # quorum queues refuse if-empty (540, which closes the connection): for them the
        # emptiness is checked just before, and a copy published in that round trip is
        # lost on this broker only, like one published while the queue does not exist
        if_empty = info.get("type", "classic") == "classic"
        for _ in range(MAX_DRAIN_ROUNDS):
            state.moved[broker][0] += session.move(state.queue, state.temp)
            if not if_empty and session.depth(state.queue):
                continue
            try:
                session.channel.queue_delete(queue=state.queue, if_empty=if_empty)
                return
            except amqp.PreconditionFailed:  # published to meanwhile: move again
                session.reopen()
            except amqp.NotFound:
                session.reopen()
                return
        raise MigrationError(
            f"{broker}: {state.queue} kept receiving messages faster than they were moved "
            f"({MAX_DRAIN_ROUNDS} rounds); the state is saved: --resume tries again"
        )

    def _recreate(self, state: MigrationState, broker: str, session: BrokerSession) -> bool:
        """Declare the queue with the new arguments and its bindings; False when it exists
        with other arguments (a worker declared it in the gap) and must be drained again."""
        try:
            session.channel.queue_declare(
                queue=state.queue, durable=True, auto_delete=False, arguments=state.arguments
            )
        except amqp.PreconditionFailed:
            session.reopen()
            return False
        for binding in state.bindings.get(broker, []):
            session.channel.queue_bind(
                queue=state.queue,
                exchange=binding["exchange"],
                routing_key=binding["routing_key"],
                arguments=binding["arguments"] or None,
            )
        session.fresh_channel()
        return True

    def _release_temp(self, state: MigrationState, broker: str) -> None:
        """Empty the temporary queue into the queue and delete it, once no worker consumes
        it and none holds an unacked delivery of it: deleting a queue drops what its
        consumers have not acked yet, and the twin of such a copy may sit in the temporary
        queue of another broker."""
        session = self._session(broker)
        try:
            self._wait_unused(state, broker, session)
            for _ in range(MAX_DRAIN_ROUNDS):
                if session.depth(state.temp) is None:
                    return
                state.moved[broker][1] += session.move(state.temp, state.queue)
                try:
                    session.channel.queue_delete(queue=state.temp, if_empty=True, if_unused=True)
                    self.store.save(state)
                    return
                except (amqp.PreconditionFailed, amqp.NotFound):
                    session.reopen()
            raise MigrationError(f"{broker}: {state.temp} did not empty; --resume tries again")
        finally:
            session.close()

    def _wait_unused(self, state: MigrationState, broker: str, session: BrokerSession) -> None:
        deadline = time.monotonic() + self.release_timeout_s
        zero_since: float | None = None
        asked_at = time.monotonic()
        while True:
            consumers = session.consumers(state.temp)
            if consumers and self.control is not None and time.monotonic() - asked_at > 2.0:
                # a broadcast reaches a worker through one broker: one whose link to it was
                # reconnecting (its queue was just deleted under it) missed it; ask again
                self.control.cancel_consumer(state.temp)
                asked_at = time.monotonic()
            unacked = None
            if consumers == 0:
                info = self.clients[broker].queue(state.temp) or {}
                unacked = int(info.get("messages_unacknowledged") or 0)
            if consumers is None or (consumers == 0 and unacked == 0):
                # the API's figures are sampled: trust a zero seen for one sample interval
                zero_since = zero_since or time.monotonic()
                if consumers is None or time.monotonic() - zero_since >= self.settle_s:
                    return
            else:
                zero_since = None
            if time.monotonic() > deadline:
                raise MigrationError(
                    f"{broker}: {state.temp} still has {consumers} consumer(s) and "
                    f"{unacked if unacked is not None else '?'} unacked message(s) after "
                    f"{self.release_timeout_s:.0f} s (a worker that missed cancel_consumer: "
                    f"restart it, or run 'celery control cancel_consumer {state.temp}'); "
                    "the state is saved: --resume tries again"
                )
            time.sleep(0.2)


class CeleryControl:
    """:class:`WorkerControl` through Celery's remote control on the same brokers: every
    worker (beetle or not) obeys ``add_consumer`` / ``cancel_consumer``; the names of those
    that answered within ``timeout_s`` are returned."""

    def __init__(
        self,
        broker_url: str,
        transport_options: Mapping[str, Any] | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        from celery import Celery

        import kombu_beetle  # noqa: F401 (registers beetle://)

        self.app = Celery("beetle-migrate", broker=broker_url, set_as_current=False)
        self.app.conf.broker_transport_options = dict(transport_options or {})
        self.timeout_s = timeout_s

    def add_consumer(self, queue: str) -> list[str]:
        replies = self.app.control.add_consumer(
            queue,
            routing_key=queue,
            options={"durable": True, "auto_delete": False},
            reply=True,
            timeout=self.timeout_s,
        )
        return sorted(name for reply in replies or [] for name in reply)

    def cancel_consumer(self, queue: str) -> list[str]:
        replies = self.app.control.cancel_consumer(queue, reply=True, timeout=self.timeout_s)
        return sorted(name for reply in replies or [] for name in reply)

    def close(self) -> None:
        self.app.close()
