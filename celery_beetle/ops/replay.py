"""Replaying dead letters: each runs exactly once, however often a replay is run.

:func:`replay` publishes a dead letter back to the queue it came from, redundantly
(to two brokers), with a fresh attempt budget and a fresh expiry, and runs it exactly once:

1. The store decides (:func:`~celery_beetle.outcome.decide_replay`, one atomic script): a
   record that cannot run again (absent, or failed with its dead letter stored) is
   deleted and the message marked ``r:<replay id>``; a completed message is never run
   again; a message with a copy in flight is left alone.
2. The message is published with publisher confirms, under its own ``message_id``.
3. The mark becomes ``p:<replay id>``, then the dead letter's copies are acked, on every
   broker that holds one. Until then they stay in ``<queue>.dead`` (unacked, and back in
   the queue when the connection closes).

The replay id is derived from the dead letter (its message id, scope and the time and
place of its death), not drawn at random, so running a replay again after it was
interrupted, or twice at once, finds the mark: between steps 1 and 3 it publishes again, and
the dedup store drops the second copy as a duplicate of the first (same ``message_id``, one
record); after step 3 it only acks. The record is reset once per dead letter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery_beetle.deadletter import PREFIX as DEAD_PREFIX
from celery_beetle.ops.dead_letters import (
    BROKER_DEATH_HEADERS,
    DeadLetter,
    DeadLetterBrowser,
    select,
)
from celery_beetle.outcome import Replay, decide_replay
from celery_beetle.store import REPLAY_MARK_TTL_MS, Store
from kombu_beetle.envelope import (
    EXPIRES_AT_HEADER,
    FLAG_DEGRADED,
    FLAG_REDUNDANT,
    FLAGS_HEADER,
    REPUBLISHED_HEADER,
)

__all__ = ["REPLAY_HEADER", "ReplayResult", "kombu_publisher", "replay", "replay_headers"]

#: header of a replayed message: the replay id of the dead letter it came from
REPLAY_HEADER = "x-beetle-replay"


def replay_headers(letter: DeadLetter) -> dict[str, Any]:
    """The headers a replayed message carries: the original ones (its ``x-beetle-flags``
    back, redundant and not degraded), without the death headers and the old expiry (the
    transport stamps a fresh one), marked with :data:`REPLAY_HEADER`. Pure."""
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
    transport_options: Mapping[str, Any] | None = None,
    publisher: Any = None,
    mark_ttl_ms: int = REPLAY_MARK_TTL_MS,
    tracer: Any = None,
) -> list[ReplayResult]:
    """Replay the named dead letters of ``queue`` (see the module docstring); each runs
    once. ``publisher``: a context manager yielding ``publish(letter, headers)`` (default:
    :func:`kombu_publisher` on ``url``). ``tracer``: where a ``replayed`` trace event goes
    once a republish is confirmed (see :mod:`kombu_beetle.trace`)."""
    results: list[ReplayResult] = []
    with DeadLetterBrowser(url, queue, transport_options=transport_options) as browser:
        chosen = select(browser.fetch(), ids=ids, task=task, everything=everything)
        if dry_run:
            return [_preview(store, letter) for letter in chosen]
        if not chosen:
            return results
        if chosen and not browser.queue_exists(queue):
            raise ValueError(
                f"queue {queue!r} exists on no reachable broker: a replay would be dropped; "
                "start a worker that declares it first"
            )
        with publisher or kombu_publisher(url, transport_options) as publish:
            for letter in chosen:
                results.append(_replay_one(browser, store, publish, letter, mark_ttl_ms, tracer))
    return results


def _preview(store: Store, letter: DeadLetter) -> ReplayResult:
    if letter.message_id is None:
        return ReplayResult(letter, "skipped", False, "no message id: cannot run it once")
    state = store.peek(letter.scope, letter.message_id)
    mark = store.replay_mark(letter.scope, letter.message_id)
    verdict = decide_replay(state, mark, letter.replay_id)
    return ReplayResult(letter, verdict.value, False, "dry run")


def _replay_one(
    browser: DeadLetterBrowser,
    store: Store,
    publish: Publisher,
    letter: DeadLetter,
    mark_ttl_ms: int,
    tracer: Any = None,
) -> ReplayResult:
    if letter.message_id is None:
        return ReplayResult(letter, "skipped", False, "no message id: cannot run it once")
    verdict = store.replay(letter.scope, letter.message_id, letter.replay_id, mark_ttl_ms)
    if verdict is Replay.IN_FLIGHT:
        return ReplayResult(letter, verdict.value, False, "a copy is pending or running: left")
    if verdict in (Replay.RUN, Replay.REPUBLISH):
        from kombu.exceptions import OperationalError

        from kombu_beetle.errors import NoBrokerAvailable, PublishNotConfirmed

        try:
            publish(letter, replay_headers(letter))
        except (OperationalError, NoBrokerAvailable, PublishNotConfirmed) as exc:
            # the mark stays r:<id>: running the replay again publishes it then
            return ReplayResult(letter, "failed", False, f"{type(exc).__name__}: {exc}")
        store.replay_published(letter.scope, letter.message_id, letter.replay_id, mark_ttl_ms)
        if tracer is not None and getattr(tracer, "enabled", False):
            tracer.emit(
                "replayed",
                letter.message_id,
                queue=letter.scope,
                task_name=letter.task,
                detail={"replay_id": letter.replay_id, "queue": letter.queue},
            )
    browser.ack(letter)
    detail = {
        Replay.RUN: "published to " + letter.queue,
        Replay.REPUBLISH: "published again (duplicates are dropped by the dedup store)",
        Replay.DONE: "replayed before: removed",
        Replay.COMPLETED: "the message completed: removed, not run again",
    }[verdict]
    return ReplayResult(letter, verdict.value, True, detail)
