"""What the gate does with deliveries it cannot run: bad input and unknown tasks.

Bad input is a delivery without a ``message_id``, with a body that does not decode, or with
a header no publisher of this project writes (:class:`BadInput`).
It is dead-lettered once per message, then acked.
If its dead letter cannot be stored it is handed back (:mod:`.handback`), never dropped.

An unknown task is what an older worker sees during a rolling deploy.
Failing it there would lose it, and mark its record failed for the newer workers.
So it is handed back for a worker that knows it.
After a grace period from when a worker first saw it
(:meth:`~celery_beetle.store.base.Store.first_seen`), it is dead-lettered.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from celery_beetle.store import Store
from celery_beetle.store.health import store_unavailable
from celery_beetle.store.state import MessageFacts
from celery_beetle.worker.facts import InvalidHeader, message_facts
from celery_beetle.worker.handback import ack
from celery_beetle.worker.outage import StoreOutage
from celery_beetle.worker.settle import GateTrace
from celery_beetle.worker.verdict import Verdict

__all__ = ["BadInput", "BadInputs", "DeadLetter"]

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


class BadInputs:
    """Bad input and unknown tasks, for :class:`~celery_beetle.worker.gate.DeliveryGate`.

    - ``store``: the dedup store (``first_seen`` of an unknown task).
    - ``dead_letter``: publishes a bad delivery's dead letter once per message.
    - ``queue_of(message)``, ``scope_of(queue)``: where a delivery came from, and its scope.
    - ``clock()``: wall-clock milliseconds.
    - ``outage``: the store's outage (``paused``, ``pause(exc)``).
    - ``hand_back(message, key, delay_s)``: requeue after a backoff.
    - ``delay_for(key)``: the backoff ``key`` has earned.
    - ``stats``, ``trace``: the gate's counts and trace writer.
    """

    def __init__(
        self,
        *,
        store: Store,
        dead_letter: DeadLetter,
        queue_of: Callable[[Any], str],
        scope_of: Callable[[str], str],
        clock: Callable[[], int],
        outage: StoreOutage,
        hand_back: Callable[..., Verdict],
        delay_for: Callable[[Any], float],
        stats: Counter[str],
        trace: GateTrace,
        message_ttl_ms: int,
        unknown_task_grace_ms: int,
    ) -> None:
        self.store = store
        self.dead_letter = dead_letter
        self.queue_of = queue_of
        self.scope_of = scope_of
        self.clock = clock
        self.outage = outage
        self.hand_back = hand_back
        self.delay_for = delay_for
        self.stats = stats
        self.trace = trace
        self.message_ttl_ms = message_ttl_ms
        self.unknown_task_grace_ms = unknown_task_grace_ms

    def admit(
        self, message: Any, message_id: Any, queue: str, scope: str, task_name: str
    ) -> MessageFacts | Verdict:
        """The facts of a delivery that is not bad input; or the verdict on one that is,
        dead-lettered (or handed back if its dead letter is not stored)."""
        if not message_id:
            return self.dead_letter_and_ack(message, queue, task_name, BadInput.NO_MESSAGE_ID, "")
        headers = message.headers if message.headers is not None else {}
        try:
            facts = message_facts(
                queue, message_id, headers, self.message_ttl_ms, self.clock(), scope
            )
        except InvalidHeader as exc:
            reason = BadInput.INVALID_HEADER
            return self.dead_letter_and_ack(message, queue, task_name, reason, str(exc))
        try:
            message.payload  # noqa: B018 (decodes once; Celery reuses the cached result)
        except Exception as exc:
            reason = BadInput.UNDECODABLE
            return self.dead_letter_and_ack(message, queue, task_name, reason, repr(exc))
        return facts

    def dead_letter_and_ack(
        self, message: Any, queue: str, task_name: str, reason: BadInput, detail: str
    ) -> Verdict:
        """Dead-letter ``message`` once per message, then ack it; if its dead letter is not
        stored (the broker refused it, Redis is down), hand it back instead."""
        self.stats[Verdict.BAD_INPUT] += 1
        shown = {
            k: (v[:100] if isinstance(v, str) else v)
            for k, v in (message.properties or {}).items()
            if k != "application_headers"
        }
        logger.error(
            "beetle: dead-lettering a %s message on queue %r (%s): %s %s",
            task_name,
            queue,
            reason.value,
            detail[:300],
            shown,
        )
        message_id = str((message.properties or {}).get("message_id") or id(message))
        key = (self.scope_of(queue), message_id[:200])
        try:
            wait_s = self.dead_letter(message, queue, reason.value, detail)
        except Exception as exc:
            logger.error("beetle: could not dead-letter the message (%r); handing it back", exc)
            return self.hand_back(message, key)
        if wait_s is not None:  # another copy's worker is dead-lettering it
            return self.hand_back(message, key, wait_s)
        # the audit's evidence that its dead letter is stored: without it a message replayed
        # from the dead letters and found bad again is counted lost
        evidence = {"reason": reason.value}
        self.trace.write("dead_lettered", key[1], key[0], message, task_name, evidence)
        ack(message)
        return Verdict.BAD_INPUT

    def unknown_task(self, message: Any, task_name: str, detail: str) -> Verdict:
        """A task this worker does not know. During a rolling deploy an older worker sees
        tasks only newer ones have: hand the message back, for a worker that knows it,
        until ``unknown_task_grace_ms`` after a worker first saw it; then dead-letter it."""
        self.stats[Verdict.UNKNOWN_TASK] += 1
        try:
            return self._unknown_task(message, task_name, detail)
        except Exception:
            logger.exception(
                "beetle: the gate failed on unknown task %r; handing it back", task_name
            )
            return self.hand_back(message, None)

    def _unknown_task(self, message: Any, task_name: str, detail: str) -> Verdict:
        queue = self.queue_of(message)
        message_id = (message.properties or {}).get("message_id")
        reason = BadInput.UNKNOWN_TASK
        if not message_id:
            return self.dead_letter_and_ack(message, queue, task_name, reason, detail)
        headers = message.headers if message.headers is not None else {}
        now = self.clock()
        try:
            facts = message_facts(
                queue, message_id, headers, self.message_ttl_ms, now, self.scope_of(queue)
            )
        except InvalidHeader as exc:
            return self.dead_letter_and_ack(
                message, queue, task_name, BadInput.INVALID_HEADER, str(exc)
            )
        if self.outage.paused:
            return self.hand_back(message, facts.identity)
        try:
            first = self.store.first_seen(facts, self.unknown_task_grace_ms + self.message_ttl_ms)
        except Exception as exc:
            if store_unavailable(exc):
                self.outage.pause(exc)
            else:
                logger.error("beetle: cannot tell when %s was first seen", message_id, exc_info=exc)
            return self.hand_back(message, facts.identity)
        waited = now - first
        if waited >= self.unknown_task_grace_ms:
            return self.dead_letter_and_ack(message, queue, task_name, reason, detail)
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
        delay = min(self.delay_for(facts.identity), UNKNOWN_TASK_MAX_WAIT_S, left_s)
        return self.hand_back(message, facts.identity, delay)
