"""What a migration asks of the workers, and how it knows they did it.

**Nothing deletes a queue while deliveries of it are held unacked anywhere.** RabbitMQ
deletes a queue whatever its consumers hold, and what they hold then is gone: countdown and
ETA tasks waiting in a worker's main process, prefetched copies, copies the gate defers or
waits with. So before a migration deletes a queue on a broker it asks every worker to hand
back what it holds of that queue (``beetle_hand_back``, :mod:`celery_beetle.ops.handback_control`:
stop consuming it, requeue every held delivery not yet started), then waits until that broker
shows the queue with no consumer and no unacked message (:func:`wait_given_back`), and only
then moves its ready messages and deletes it. Runs already in the pool end as usual and are
acked; the wait covers them.

The broker's figures: the consumer count is read over AMQP (a passive declare, exact); the
unacked count only the management API has, and it samples it (every 5 s by default,
``collect_statistics_interval``). Once no consumer is left nothing new can be delivered, so
the unacked count only falls: a zero the API shows for ``settle_s`` (longer than its
interval) after the last consumer went is a zero. While consumers or unacked messages
remain, the workers are asked again every :data:`ASK_AGAIN_S` (a broadcast reaches a worker
through one broker, a worker may have missed it, or a copy was in flight in the gate when the
first one came); past ``timeout_s`` the migration stops with its state saved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from celery_beetle.ops.management import ManagementClient
from celery_beetle.ops.migration_state import MigrationError
from celery_beetle.ops.mover import BrokerSession

__all__ = ["ASK_AGAIN_S", "CeleryControl", "WorkerControl", "wait_given_back"]

#: while a queue still has consumers or unacked messages, the workers are asked again this often
ASK_AGAIN_S = 2.0


class WorkerControl(Protocol):
    """What the migration tells the workers (Celery's remote control); each call returns
    the names of the workers that answered."""

    def add_consumer(self, queue: str) -> list[str]: ...

    def hand_back(self, queue: str, resume_after_s: float) -> list[str]: ...

    def consume(self, queue: str) -> list[str]: ...


def wait_given_back(
    broker: str,
    queue: str,
    session: BrokerSession,
    client: ManagementClient,
    ask: Callable[[], Any] | None,
    *,
    settle_s: float,
    timeout_s: float,
    what_to_do: str,
    echo: Callable[[str], None] | None = None,
) -> None:
    """Return once ``queue`` on ``broker`` has no consumer and no unacked message (or does
    not exist), asking the workers (``ask``) again while it has; a MigrationError after
    ``timeout_s``."""
    if ask is not None:
        ask()
    asked_at = started = time.monotonic()
    zero_since: float | None = None
    while True:
        consumers = session.consumers(queue)
        if consumers is None:
            return
        unacked: int | None = None
        if consumers == 0:
            info = client.queue(queue) or {}
            unacked = int(info.get("messages_unacknowledged") or 0)
        now = time.monotonic()
        if consumers == 0 and unacked == 0:
            zero_since = zero_since or now
            if now - zero_since >= settle_s:
                return
        else:
            zero_since = None
            if ask is not None and now - asked_at >= ASK_AGAIN_S:
                if echo is not None:
                    echo(
                        f"{broker}: {queue} has {consumers} consumer(s) and "
                        f"{unacked if unacked is not None else '?'} unacked message(s): "
                        "asking the workers again"
                    )
                ask()
                asked_at = now
        if now - started > timeout_s:
            raise MigrationError(
                f"{broker}: {queue} still has {consumers} consumer(s) and "
                f"{unacked if unacked is not None else '?'} unacked message(s) after "
                f"{timeout_s:.0f} s: {what_to_do}; the state is saved: --resume tries again"
            )
        time.sleep(0.2)


class CeleryControl:
    """:class:`WorkerControl` through Celery's remote control on the same brokers.
    ``add_consumer`` is Celery's own (every worker obeys it); ``hand_back`` and ``consume``
    are beetle's (``celery_beetle.install`` registers them on its workers).

    A broadcast reaches every worker whatever its reply wait; the replies only name who
    answered, and the migration's own check is the broker's (:func:`wait_given_back`). So once
    some workers have answered, a broadcast stops waiting when as many have answered again
    (Celery's ``limit``) instead of waiting out ``timeout_s`` each time: a migration asks a
    dozen times or more, and waited about 2 s at each. A worker that stopped answering still
    costs the whole ``timeout_s``, as before.
    """

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
        #: the workers that have answered any broadcast of this process
        self.known: set[str] = set()

    def add_consumer(self, queue: str) -> list[str]:
        replies = self.app.control.add_consumer(
            queue,
            routing_key=queue,
            options={"durable": True, "auto_delete": False},
            reply=True,
            timeout=self.timeout_s,
            limit=self._limit(),
        )
        return self._remember(replies)

    def hand_back(self, queue: str, resume_after_s: float) -> list[str]:
        return self._broadcast(
            "beetle_hand_back", {"queue": queue, "resume_after_s": resume_after_s}
        )

    def consume(self, queue: str) -> list[str]:
        return self._broadcast("beetle_consume", {"queue": queue})

    def _broadcast(self, command: str, arguments: dict[str, Any]) -> list[str]:
        replies = self.app.control.broadcast(
            command,
            arguments=arguments,
            reply=True,
            timeout=self.timeout_s,
            limit=self._limit(),
        )
        return self._remember(replies)

    def _limit(self) -> int | None:
        """Replies to wait for: as many workers as have answered before (None: all, until
        ``timeout_s``)."""
        return len(self.known) or None

    def _remember(self, replies: Any) -> list[str]:
        """The workers that answered, added to :attr:`known`."""
        names = _answered(replies)
        self.known.update(names)
        return names

    def close(self) -> None:
        self.app.close()


def _answered(replies: Any) -> list[str]:
    return sorted(
        name
        for reply in replies or []
        for name, answer in reply.items()
        if not (isinstance(answer, dict) and "error" in answer)
    )
