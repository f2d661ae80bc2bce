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
* nothing deletes a queue while deliveries of it are held unacked anywhere (countdown/ETA
  tasks in a worker, prefetched or deferred copies): before each delete the workers hand
  back what they hold of the queue, and the broker must show it with no consumer and no
  unacked message (:mod:`celery_beetle.ops.migration_control`);
* every task message sits on two brokers, and the migration does one broker at a time, the
  next one only once the previous one's queue is back and its held deliveries consumed
  again: a copy published to the broker being migrated in the instant its queue does not
  exist (one round trip) is dropped by that broker, and its twin on another broker, whose
  queue exists then, runs it.

Steps (each one idempotent, the state saved after each, so a ``kill -9`` anywhere and
``--resume`` completes it)::

    planned        declare <queue>.beetle-migrating on every broker; tell the workers
                   (Celery's remote control, ``add_consumer``) to consume it too
    per broker, one after the other:
      pending      save <queue>'s bindings; tell the workers to hand back <queue>
                   (``beetle_hand_back``: they stop consuming it and requeue what they
                   hold of it) and wait until this broker shows it with no consumer and no
                   unacked message; move its ready messages to the temporary queue (acked
                   once confirmed); delete <queue> if empty and unused, else again
      drained      declare <queue> with the new arguments and its bindings; if a worker
                   re-declared it with the old ones meanwhile, drain again
      recreated    move the temporary queue's messages back; the workers consume <queue>
                   again (``beetle_consume``)
      moved-back
    temp-consumed  the workers hand back the temporary queue (what they hold of it is
                   requeued there), as above
    temp-released  move what is left back, delete the temporary queues once empty and unused
    done

Only one process carries a migration on: every step that deletes, declares or moves is
fenced by the lease (:mod:`celery_beetle.ops.migration_state`), and a process that lost it
stops before the step with :class:`~celery_beetle.ops.migration_state.LeaseLost`.

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import amqp

from celery_beetle.ops.management import ManagementClient, ManagementError
from celery_beetle.ops.migration_control import CeleryControl, WorkerControl, wait_given_back
from celery_beetle.ops.migration_state import (
    BROKER_STEPS,
    MOVE_FENCE_EVERY,
    PHASES,
    LeaseLost,
    MigrationError,
    MigrationLock,
    MigrationState,
    StateStore,
)
from celery_beetle.ops.mover import BrokerSession, open_session
from celery_beetle.ops.policies import QUORUM_LIMITS_NOTE
from kombu_beetle.options import BeetleOptions

__all__ = [
    "BROKER_STEPS",
    "PHASES",
    "CeleryControl",
    "LeaseLost",
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
    """Carries a :class:`MigrationState` to ``done`` over the brokers of ``options``.

    ``lock``: the lease this process holds (:meth:`StateStore.lock`); every save and every
    step that deletes, declares or moves checks it first. Without one nothing is fenced
    (tests of a single process)."""

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
        lock: MigrationLock | None = None,
    ) -> None:
        #: the management API samples queue figures every 5 s (collect_statistics_interval)
        self.settle_s = settle_s
        #: how long held deliveries may take to come back (runs in the pool to end)
        self.release_timeout_s = release_timeout_s
        self.options = options
        self.clients = {c.name: c for c in clients}
        self.store = store
        self.control = control
        self.echo = echo
        self.session_for = session_for
        self.lock = lock

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
            f"  2. per broker: workers hand back what they hold of {state.queue}; move "
            f"{state.queue} -> {state.temp}, delete {state.queue}, declare it with the new "
            f"arguments and its bindings, move back; workers consume {state.queue} again",
            f"  3. workers hand back {state.temp}; it is emptied into {state.queue} and deleted",
        ]
        if state.arguments.get("x-queue-type") == "quorum":
            lines.append(QUORUM_LIMITS_NOTE.format(queue=state.queue))
        return "\n".join(lines)

    # -- running -----------------------------------------------------------------------------

    def run(self, state: MigrationState) -> MigrationState:
        try:
            return self._run(state)
        except LeaseLost:
            raise  # another process carries it on: leave the workers to it
        except MigrationError:
            # stopped: workers told to hand the queue back consume it again (they would by
            # themselves, later); --resume asks them to hand it back again
            self._consume(state.queue)
            raise

    def _run(self, state: MigrationState) -> MigrationState:
        if state.phase == "planned":
            self._fence("declaring the temporary queue")
            self._declare_temp(state)
            if self.control is not None:
                state.workers = self.control.add_consumer(state.temp)
                self.echo(f"{len(state.workers)} worker(s) consume {state.temp}")
            self._advance(state, phase="temp-consumed")
        if state.phase == "temp-consumed":
            for broker in state.brokers:
                self._migrate_broker(state, broker)
            self._consume(state.queue)
            if self.control is not None:
                self.control.hand_back(state.temp, 0)
                self.echo(f"workers told to hand back {state.temp}")
            self._advance(state, phase="temp-released")
        if state.phase == "temp-released":
            for broker in state.brokers:
                self._release_temp(state, broker)
            self._advance(state, phase="done")
        return state

    def _fence(self, before: str) -> None:
        """Stop here unless this process still holds the lease (extended by the check)."""
        if self.lock is not None:
            self.lock.check(before)

    def _save(self, state: MigrationState) -> None:
        self.store.save(state, self.lock)

    def _consume(self, queue: str) -> None:
        if self.control is not None:
            self.control.consume(queue)

    def _hand_back(self, state: MigrationState, queue: str) -> None:
        """Ask the workers to hand ``queue`` back; they consume it again when told to, or
        by themselves well after this migration would have given up waiting (never the
        temporary queue: it goes)."""
        if self.control is not None:
            resume_after_s = 0.0 if queue == state.temp else self.release_timeout_s + 120.0
            self.control.hand_back(queue, resume_after_s)

    def _advance(self, state: MigrationState, *, phase: str | None = None,
                 broker: str | None = None, step: str | None = None) -> None:  # fmt: skip
        if phase is not None:
            state.phase = phase
        if broker is not None and step is not None:
            state.steps[broker] = step
        self._save(state)
        if phase is not None:
            self.echo(f"{state.queue}: {phase}")
        if broker is not None and step is not None:
            self.echo(f"{broker}: {state.queue} {step}")

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

    def _move(self, session: BrokerSession, source: str, target: str, what: str) -> int:
        """Move in slices, the lease checked before each."""
        moved = 0
        while True:
            self._fence(what)
            slice_moved = session.move(source, target, limit=MOVE_FENCE_EVERY)
            moved += slice_moved
            if slice_moved < MOVE_FENCE_EVERY:
                return moved

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
                    self._fence(f"declaring {state.queue} again on {broker}")
                    if self._recreate(state, broker, session):
                        self._advance(state, broker=broker, step="recreated")
                    else:  # re-declared with the old arguments meanwhile: again
                        self._advance(state, broker=broker, step="pending")
                elif step == "recreated":
                    what = f"moving {state.temp} back to {state.queue} on {broker}"
                    state.moved[broker][1] += self._move(session, state.temp, state.queue, what)
                    self._advance(state, broker=broker, step="moved-back")
                    self._consume(state.queue)
        except (amqp.ConnectionError, OSError) as exc:
            raise MigrationError(
                f"broker {broker} failed during step {state.steps[broker]!r} ({exc!r}); "
                "the state is saved: run again with --resume once it is back"
            ) from exc
        finally:
            session.close()

    def _wait_given_back(
        self, state: MigrationState, broker: str, queue: str, session: BrokerSession
    ) -> None:
        wait_given_back(
            broker,
            queue,
            session,
            self.clients[broker],
            (lambda: self._hand_back(state, queue)) if self.control is not None else None,
            settle_s=self.settle_s,
            timeout_s=self.release_timeout_s,
            echo=self.echo,
            what_to_do=(
                f"a worker that did not hand it back (not a beetle worker, or one that "
                f"missed 'beetle_hand_back'; 'beetle fleet -Q {queue}' lists them): restart "
                "or stop it"
            ),
        )

    def _drain(self, state: MigrationState, broker: str, session: BrokerSession) -> None:
        if session.depth(state.queue) is None:
            return  # deleted before a crash: its messages are in the temporary queue
        if broker not in state.bindings:
            state.bindings[broker] = self.clients[broker].queue_bindings(state.queue)
            self._save(state)
        info = self.clients[broker].queue(state.queue) or {}
        # quorum queues refuse if-empty and if-unused (540, which closes the connection):
        # for them emptiness and consumers are checked just before, and a copy published in
        # that round trip is lost on this broker only, like one published while the queue
        # does not exist
        classic = info.get("type", "classic") == "classic"
        for _ in range(MAX_DRAIN_ROUNDS):
            self._wait_given_back(state, broker, state.queue, session)
            what = f"moving {state.queue} to {state.temp} on {broker}"
            state.moved[broker][0] += self._move(session, state.queue, state.temp, what)
            if not classic and (session.depth(state.queue) or session.consumers(state.queue)):
                continue
            self._fence(f"deleting {state.queue} on {broker}")
            try:
                session.channel.queue_delete(queue=state.queue, if_empty=classic, if_unused=classic)
                return
            except amqp.PreconditionFailed:  # published to, or consumed, meanwhile: again
                session.reopen()
            except amqp.NotFound:
                session.reopen()
                return
        raise MigrationError(
            f"{broker}: {state.queue} kept receiving messages or consumers faster than they "
            f"were moved or handed back ({MAX_DRAIN_ROUNDS} rounds); the state is saved: "
            "--resume tries again"
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
            for _ in range(MAX_DRAIN_ROUNDS):
                if session.depth(state.temp) is None:
                    return
                self._wait_given_back(state, broker, state.temp, session)
                what = f"moving {state.temp} back to {state.queue} on {broker}"
                state.moved[broker][1] += self._move(session, state.temp, state.queue, what)
                self._fence(f"deleting {state.temp} on {broker}")
                try:
                    session.channel.queue_delete(queue=state.temp, if_empty=True, if_unused=True)
                    self._save(state)
                    return
                except (amqp.PreconditionFailed, amqp.NotFound):
                    session.reopen()
            raise MigrationError(f"{broker}: {state.temp} did not empty; --resume tries again")
        finally:
            session.close()
