"""What the gate does with deliveries it cannot run: bad input and unknown tasks.

Bad input (no ``message_id``, a body that does not decode, a header no publisher of this
project writes) is dead-lettered once per message, then acked; if its dead letter cannot be
stored it is handed back instead (:mod:`celery_beetle.worker.handback`), never dropped.

An unknown task is what an older worker sees during a rolling deploy, when newer workers
already publish a task it does not have. Failing it there would lose it (and mark its record
failed, so the newer worker would drop the other copy); instead it is handed back for a worker
that knows it, until a grace period after a worker first saw it (kept in Redis:
:meth:`~celery_beetle.store.base.Store.first_seen`), and only then dead-lettered.

:class:`BadInputHandling` is part of :class:`~celery_beetle.worker.gate.DeliveryGate`; it is apart
only so each module reads on its own.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from celery_beetle.store import Store
from celery_beetle.store.health import store_unavailable
from celery_beetle.worker.facts import InvalidHeader, message_facts
from celery_beetle.worker.handback import HandBacks, ack
from kombu_beetle.scopes import scope_of

__all__ = ["BadInput", "BadInputHandling", "DeadLetter"]

logger = logging.getLogger(__name__)

#: An unknown task waits at most this long between hand-backs.
UNKNOWN_TASK_MAX_WAIT_S = 5.0


class BadInput(str, enum.Enum):
    """Why a delivery cannot be gated; the value goes into the dead letter's headers."""

    NO_MESSAGE_ID = "no_message_id"
    UNDECODABLE = "undecodable"
    UNKNOWN_TASK = "unknown_task"
    INVALID_HEADER = "invalid_header"


#: ``dead_letter(message, queue, reason, detail)`` answers None when the message may be
#: acked (its dead letter is stored, now or by another copy), or seconds after which to
#: hand it back (another copy's worker is on it); it raises when the dead letter is not
#: stored.
DeadLetter = Callable[[Any, str, str, str], float | None]


class BadInputHandling:
    """Bad input and unknown tasks, for :class:`~celery_beetle.worker.gate.DeliveryGate`."""

    # provided by the gate
    store: Store
    dead_letter: DeadLetter
    queue_of: Callable[[Any], str]
    scopes: Mapping[str, str]
    clock: Callable[[], int]
    message_ttl_ms: int
    unknown_task_grace_ms: int
    paused: bool
    stats: Counter[str]
    handbacks: HandBacks

    def _hand_back(self, message: Any, key: Any, delay_s: float | None = None) -> str:
        raise NotImplementedError

    def _pause(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _trace(
        self,
        event: str,
        message_id: str,
        queue: str,
        task_name: str,
        message: Any,
        detail: dict[str, Any] | None = None,
    ) -> None:
        raise NotImplementedError

    def _bad_input(self, message: Any, queue: str, task_name: str, reason: str, detail: str) -> str:
        """Dead-letter ``message`` once per message, then ack it; if its dead letter is not
        stored (the broker refused it, Redis is down), hand it back instead."""
        self.stats["bad_input"] += 1
        shown = {
            k: (v[:100] if isinstance(v, str) else v)
            for k, v in (message.properties or {}).items()
            if k != "application_headers"
        }
        logger.error(
            "beetle: dead-lettering a %s message on queue %r (%s): %s %s",
            task_name,
            queue,
            reason,
            detail[:300],
            shown,
        )
        message_id = str((message.properties or {}).get("message_id") or id(message))
        key = (scope_of(self.scopes, queue), message_id[:200])
        try:
            wait_s = self.dead_letter(message, queue, reason, detail)
        except Exception as exc:
            logger.error("beetle: could not dead-letter the message (%r); handing it back", exc)
            return self._hand_back(message, key)
        if wait_s is not None:  # another copy's worker is dead-lettering it
            return self._hand_back(message, key, wait_s)
        # the audit's evidence that its dead letter is stored: without it a message replayed
        # from the dead letters and found bad again is counted lost (the explorer's seed 5071)
        self._trace("dead_lettered", key[1], key[0], task_name, message, {"reason": reason})
        ack(message)
        return "bad_input"

    def unknown_task(self, message: Any, task_name: str, detail: str) -> str:
        """A task this worker does not know. During a rolling deploy an older worker sees
        tasks only newer ones have: hand the message back, for a worker that knows it,
        until ``unknown_task_grace_ms`` after a worker first saw it; then dead-letter it."""
        self.stats["unknown_task"] += 1
        try:
            return self._unknown_task(message, task_name, detail)
        except Exception:
            logger.exception(
                "beetle: the gate failed on unknown task %r; handing it back", task_name
            )
            return self._hand_back(message, None)

    def _unknown_task(self, message: Any, task_name: str, detail: str) -> str:
        queue = self.queue_of(message)
        message_id = (message.properties or {}).get("message_id")
        reason = BadInput.UNKNOWN_TASK.value
        if not message_id:
            return self._bad_input(message, queue, task_name, reason, detail)
        headers = message.headers if message.headers is not None else {}
        now = self.clock()
        try:
            facts = message_facts(
                queue, message_id, headers, self.message_ttl_ms, now, scope_of(self.scopes, queue)
            )
        except InvalidHeader as exc:
            return self._bad_input(
                message, queue, task_name, BadInput.INVALID_HEADER.value, str(exc)
            )
        if self.paused:
            return self._hand_back(message, facts.identity)
        try:
            first = self.store.first_seen(facts, self.unknown_task_grace_ms + self.message_ttl_ms)
        except Exception as exc:
            if store_unavailable(exc):
                self._pause(exc)
            else:
                logger.error("beetle: cannot tell when %s was first seen", message_id, exc_info=exc)
            return self._hand_back(message, facts.identity)
        waited = now - first
        if waited >= self.unknown_task_grace_ms:
            return self._bad_input(message, queue, task_name, reason, detail)
        logger.warning(
            "beetle: no task %r on this worker (an older version during a deploy?); handing "
            "%s back for a worker that knows it (%.0f s of its %.0f s grace gone)",
            task_name,
            message_id[:100],
            waited / 1000,
            self.unknown_task_grace_ms / 1000,
        )
        # not the usual 30 s cap: a deploy's newer workers should get it within seconds
        left_s = (self.unknown_task_grace_ms - waited) / 1000
        delay = min(self.handbacks.delay_for(facts.identity), UNKNOWN_TASK_MAX_WAIT_S, left_s)
        return self._hand_back(message, facts.identity, delay)
