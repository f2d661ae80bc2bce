"""Replaying dead letters: each runs exactly once, however often a replay is run, and never
when it may have completed.

:func:`replay` publishes a dead letter back to the queue it came from, redundantly
(to two brokers), with a fresh attempt budget and a fresh expiry, and runs it exactly once:

1. The store decides (:func:`~celery_beetle.store.outcome.decide_replay`, one atomic script): a
   record that cannot run again (failed with its dead letter stored, or absent while the
   message is still within its dedup window) is deleted and the message marked
   ``r:<replay id>:<expiry of the copy to publish>``; a completed message is never run
   again; a message with a copy in flight is left alone; and what nothing proves did not
   complete is refused (below).
2. The message is published with publisher confirms, under its own ``message_id``, with the
   expiry in the mark (``x-beetle-expires-at``: now plus the transport's ``message_ttl``).
3. The mark becomes ``p:...``, then the dead letter's copies are acked, on every broker
   that holds one. Until then they stay in ``<queue>.dead`` (unacked, and back in the
   queue when the connection closes).

The replay id is derived from the dead letter's message and generation
(:func:`~celery_beetle.ops.dead_letters.describe`), not drawn at random, so running a
replay again after it was interrupted, or twice at once, finds the mark: between steps 1
and 3 it publishes again, with the expiry of the first publish, and the dedup store drops
the second copy as a duplicate of the first (same ``message_id``, one record, and every
copy expires before that record does); after step 3 it only acks. The record is reset once
per dead letter.

**Past the dedup window a replay refuses what it cannot prove.** A record lives until its
message's expiry plus the workers' margin (``beetle_key_ttl_margin``); a dead letter lives
until someone removes it. A record that is absent therefore proves nothing once the window
is over: the message's twin (a copy a broker expired, or one past a delivery limit) or an
earlier replay may have completed and its record expired since. So with no record a
replay runs the message only while it is within its window (the dead letter's
``x-beetle-expires-at``); a replay resumed after its own copy's window would publish again
what may have run; both are ``refused``, with the reason, and ``force=True`` (``--force``)
runs them anyway. The common case stays provable: a message a worker gave up keeps its
failed record as long as dead letters wait (``beetle_dead_letter_retention``, 30 days), and
the mark lives as long, and past both windows. ``beetle dead list`` shows, with the store,
what a replay would do with each entry and why (:func:`preview`).

A failed record proves the message never *completed* in the store; it does not prove that
no body ran to its end. A dead letter with reason ``attempts_limit`` stands for a run that
never reported (its worker was killed, or it outlived its lease), whose effects may be
committed. A body that commits through the inbox (:mod:`celery_beetle.outbox.inbox`) is
guarded against that by its inbox row, but only while the row lives: rows live until the
message's expiry (the first run's, not the replay's) and are then swept. A replay within
that window finds the row and the body returns; after it, the body's transaction commits
again. Replay such dead letters within the message's window, or check their effects first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from celery_beetle.ops.dead_letters import (
    BROKER_DEATH_HEADERS,
    REPLAY_HEADER,
    DeadLetter,
    DeadLetterBrowser,
    select,
)
from celery_beetle.store import REPLAY_MARK_TTL_MS, Store
from celery_beetle.store.outcome import Replay, ReplayMark, decide_replay
from celery_beetle.worker.deadletter import PREFIX as DEAD_PREFIX
from kombu_beetle.envelope import (
    EXPIRES_AT_HEADER,
    FLAG_DEGRADED,
    FLAG_REDUNDANT,
    FLAGS_HEADER,
    REPUBLISHED_HEADER,
)

__all__ = [
    "REPLAY_HEADER",
    "ReplayResult",
    "kombu_publisher",
    "preview",
    "refusal",
    "replay",
    "replay_headers",
]


def replay_headers(letter: DeadLetter, expires_at_ms: int = 0) -> dict[str, Any]:
    """The headers a replayed message carries: the original ones (its ``x-beetle-flags``
    back, redundant and not degraded), without the death headers, with the replay's expiry
    (``expires_at_ms``; 0: none, the transport stamps one) instead of the old one, marked
    with :data:`REPLAY_HEADER`. Pure."""
    headers = {
        k: v
        for k, v in letter.headers.items()
        if not k.startswith(DEAD_PREFIX)
        and k not in BROKER_DEATH_HEADERS
        and k != EXPIRES_AT_HEADER
    }
    try:
        flags = int(letter.headers.get(DEAD_PREFIX + "flags", headers.get(FLAGS_HEADER)) or 0)
    except (TypeError, ValueError):
        flags = 0
    headers[FLAGS_HEADER] = (flags | FLAG_REDUNDANT) & ~FLAG_DEGRADED
    if expires_at_ms > 0:
        headers[EXPIRES_AT_HEADER] = expires_at_ms // 1000
    headers[REPLAY_HEADER] = letter.replay_id
    # a continuation of a traced message, as a retry is: the publisher side does not trace
    # it as a new publish
    headers[REPUBLISHED_HEADER] = 1
    return headers


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did with one dead letter: ``outcome`` is the store's verdict (or
    ``skipped`` / ``failed``), ``acked``: its copies were removed."""

    letter: DeadLetter
    outcome: str
    acked: bool
    detail: str = ""


Publisher = Callable[[DeadLetter, dict[str, Any]], None]


def kombu_publisher(url: str, transport_options: Mapping[str, Any] | None = None) -> Any:
    """A publisher through the ``beetle://`` transport (two brokers, publisher confirms),
    as a context manager yielding ``publish(letter, headers)``."""
    from kombu import Connection

    import kombu_beetle  # noqa: F401  (registers beetle://)

    @contextmanager
    def opened() -> Any:
        with Connection(url, transport_options=dict(transport_options or {})) as conn:
            producer = conn.Producer()

            def publish(letter: DeadLetter, headers: dict[str, Any]) -> None:
                producer.publish(
                    letter.body,
                    exchange="",
                    routing_key=letter.queue,
                    content_type=letter.content_type,
                    content_encoding=letter.content_encoding,
                    headers=headers,
                    delivery_mode=2,
                    retry=True,
                    retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
                    **letter.properties,
                )

            yield publish

    return opened()


def replay(
    url: str,
    queue: str,
    store: Store,
    *,
    ids: Sequence[str] = (),
    task: str | None = None,
    everything: bool = False,
    dry_run: bool = False,
    force: bool = False,
    transport_options: Mapping[str, Any] | None = None,
    publisher: Any = None,
    mark_ttl_ms: int = REPLAY_MARK_TTL_MS,
    tracer: Any = None,
    errors: dict[str, str] | None = None,
) -> list[ReplayResult]:
    """Replay the named dead letters of ``queue`` (see the module docstring); each runs
    once. ``force``: run also what the store cannot prove did not complete (``refused``
    otherwise). ``publisher``: a context manager yielding ``publish(letter, headers)``
    (default: :func:`kombu_publisher` on ``url``). ``tracer``: where a ``replayed`` trace
    event goes once a republish is confirmed (see :mod:`kombu_beetle.trace`). ``errors``:
    filled with ``{broker: why}`` for each broker that could not be read (their copies
    stay where they are); when none could be, :class:`.NoBrokerReadable` is raised."""
    results: list[ReplayResult] = []
    with DeadLetterBrowser(url, queue, transport_options=transport_options) as browser:
        chosen = select(browser.fetch(), ids=ids, task=task, everything=everything, queue=queue)
        if errors is not None:
            errors.update(browser.errors)
        if dry_run:
            return [preview(store, letter, force=force) for letter in chosen]
        if not chosen:
            return results
        if chosen and not browser.queue_exists(queue):
            raise ValueError(
                f"queue {queue!r} exists on no reachable broker: a replay would be dropped; "
                "start a worker that declares it first"
            )
        # whole seconds: x-beetle-expires-at is in seconds, and the mark must say the same
        ttl_ms = round(browser.options.message_ttl_s * 1000)
        with publisher or kombu_publisher(url, transport_options) as publish:
            for letter in chosen:
                expires_at_ms = (store.clock() + ttl_ms) // 1000 * 1000
                step = _Step(store, publish, expires_at_ms, force, mark_ttl_ms, tracer)
                results.append(step.run(browser, letter))
    return results


def preview(store: Store, letter: DeadLetter, *, force: bool = False) -> ReplayResult:
    """What a replay would do with ``letter`` now, and why (``beetle dead list``, and
    ``replay --dry-run``); changes nothing."""
    if letter.message_id is None:
        return ReplayResult(letter, "skipped", False, "no message id: cannot run it once")
    state = store.peek(letter.scope, letter.message_id)
    mark = store.replay_mark(letter.scope, letter.message_id)
    window_end_ms = letter.expires_at_ms or 0
    verdict = decide_replay(state, mark, letter.replay_id, window_end_ms, store.clock(), force)
    if verdict is Replay.REFUSED:
        return ReplayResult(letter, verdict.value, False, refusal(letter, mark))
    return ReplayResult(letter, verdict.value, False, "dry run")


def refusal(letter: DeadLetter, mark: str | None) -> str:
    """Why a replay refuses ``letter`` (the store holds no record; ``mark``: the message's
    replay mark), and what overrides it. Pure."""
    marked = ReplayMark.parse(mark)
    if marked is not None and marked.replay_id == letter.replay_id:
        return (
            "a replay of it began, and the copy it published left its dedup window "
            f"{_when(marked.expires_at_ms)}: that copy may have run and completed, its record "
            "expired since; --force publishes it again"
        )
    if marked is not None:
        return (
            "another replay published it, and that copy left its dedup window "
            f"{_when(marked.expires_at_ms)}: it may have completed, its record expired since; "
            "--force runs it anyway"
        )
    if letter.expires_at_ms is None:
        return (
            "it carries no expiry, and the store holds no record of it: it may have run and "
            "completed; --force runs it anyway"
        )
    return (
        f"its dedup window ended {_when(letter.expires_at_ms)} and the store holds no record "
        "of it: a twin copy or an earlier replay may have completed, its record expired "
        "since; --force runs it anyway"
    )


def _when(ms: int) -> str:
    if ms <= 0:
        return "at an unknown time"
    stamp = datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return f"at {stamp} UTC"


_DETAIL = {
    Replay.RUN: "published",
    Replay.REPUBLISH: "published again (duplicates are dropped by the dedup store)",
    Replay.DONE: "replayed before: removed",
    Replay.COMPLETED: "the message completed: removed, not run again",
    Replay.IN_FLIGHT: "a copy is pending or running, or another replay's is on its way: left",
}


@dataclass
class _Step:
    """One replay's settings, applied to each dead letter in turn."""

    store: Store
    publish: Publisher
    expires_at_ms: int
    force: bool
    mark_ttl_ms: int
    tracer: Any

    def run(self, browser: DeadLetterBrowser, letter: DeadLetter) -> ReplayResult:
        store = self.store
        if letter.message_id is None:
            return ReplayResult(letter, "skipped", False, "no message id: cannot run it once")
        verdict, expires_at_ms = store.replay(
            letter.scope,
            letter.message_id,
            letter.replay_id,
            window_end_ms=letter.expires_at_ms or 0,
            expires_at_ms=self.expires_at_ms,
            force=self.force,
            mark_ttl_ms=self.mark_ttl_ms,
        )
        if verdict is Replay.REFUSED:
            mark = store.replay_mark(letter.scope, letter.message_id)
            return ReplayResult(letter, verdict.value, False, refusal(letter, mark))
        if verdict is Replay.IN_FLIGHT:
            return ReplayResult(letter, verdict.value, False, _DETAIL[verdict])
        if verdict in (Replay.RUN, Replay.REPUBLISH):
            from kombu.exceptions import OperationalError

            from kombu_beetle.errors import NoBrokerAvailable, PublishNotConfirmed

            # a mark older than recorded expiries has none: this publish gets a fresh one
            expires_at_ms = expires_at_ms or self.expires_at_ms
            try:
                self.publish(letter, replay_headers(letter, expires_at_ms))
            except (OperationalError, NoBrokerAvailable, PublishNotConfirmed) as exc:
                # the mark stays r:<id>: running the replay again publishes it then
                return ReplayResult(letter, "failed", False, f"{type(exc).__name__}: {exc}")
            store.replay_published(
                letter.scope, letter.message_id, letter.replay_id, expires_at_ms, self.mark_ttl_ms
            )
            self._trace(letter)
        browser.ack(letter)
        detail = _DETAIL[verdict]
        if verdict is Replay.RUN:
            detail = "published to " + letter.queue
        return ReplayResult(letter, verdict.value, True, detail)

    def _trace(self, letter: DeadLetter) -> None:
        if self.tracer is not None and getattr(self.tracer, "enabled", False):
            self.tracer.emit(
                "replayed",
                letter.message_id,
                queue=letter.scope,
                task_name=letter.task,
                detail={"replay_id": letter.replay_id, "queue": letter.queue},
            )
