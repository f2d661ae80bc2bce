"""The explorer's publisher: a thread that publishes every item of a scenario at its time.

It publishes as a user's code would: ``apply_async`` through a ``beetle://`` connection, a
chain and a group through Celery's canvas, an outbox enqueue inside a SQLAlchemy transaction
that commits or rolls back (a committed row is published by the run's ``beetle relay``, a
rolled-back one never exists), and a raw message with a defect straight to one broker. It
remembers which publishes were confirmed (a committed enqueue counts as confirmed: the
outbox promises it from the commit on); only those are judged, plus every rolled-back
enqueue, which must never run.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

from kombu import Connection

from celery_beetle.testing.explorer import checker
from celery_beetle.testing.explorer.scenario import SECOND_QUEUE, Item

if TYPE_CHECKING:
    from celery_beetle.testing.explorer.run import Run

__all__ = ["Publisher"]

#: the publish retry policy: long enough to ride out a broker restart
POLICY = {"max_retries": 60, "interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5}


class _RollBack(Exception):
    """Raised inside an outbox transaction to roll it back, as a failing request would."""


class Publisher(threading.Thread):
    """Publishes every item at its time; remembers which publishes were confirmed."""

    def __init__(self, run: Run) -> None:
        super().__init__(daemon=True, name="explorer-publisher")
        self.run_ = run
        self.confirmed: set[str] = set()
        #: outbox enqueues whose transaction was rolled back (each must never run)
        self.rolled_back: set[str] = set()
        self.errors: list[str] = []
        self._db: Any = None  # the run's database engine, for outbox enqueues

    def run(self) -> None:
        try:
            self._publish_all()
        finally:
            if self._db is not None:
                self._db.dispose()

    def _publish_all(self) -> None:
        from celery_beetle.testing.explorer.app import make_app

        run = self.run_
        app = make_app(
            run.url,
            run.redis_url,
            queue=run.queue,
            trace_dir=str(run.trace),  # the outbox's ``enqueued`` events
            transport_options={**run.transport_options, "trace_dir": str(run.trace)},
            task_options=run.scenario.settings.task_options(),
            conf=run.app_conf,
        )
        if run.scenario.chords:
            # a chord needs the result backend; the publisher never waits for a result, so
            # it subscribes to none (Celery's Redis backend would, for every task it sends)
            app.backend.result_consumer.consume_from = lambda task_id: None
        with Connection(run.url, transport_options=app.conf.broker_transport_options) as conn:
            for item in run.scenario.items:
                wait = run.started + item.at_s - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                key = run.key(item)
                try:
                    if self._publish(app, conn, item, key):
                        self.confirmed.add(key)
                except Exception as exc:  # counted; a publish that failed is not judged
                    self.errors.append(f"{key}: {type(exc).__name__}: {exc}")
        from kombu_beetle.trace import flush_all

        flush_all()

    def _publish(self, app: Any, conn: Any, item: Item, key: str) -> bool:
        """Publish ``item``; True when it is confirmed (and so judged as published)."""
        if item.kind == "bad":
            self._publish_bad(item, key)
        elif item.kind == "chain":
            self._publish_chain(app, item, key)
        elif item.kind == "group":
            self._publish_group(app, item, key)
        elif item.kind == "chord":
            self._publish_chord(app, item, key)
        elif item.kind == "outbox":
            return self._enqueue(app, item, key)
        elif item.kind == "scoped":
            self._publish_scoped(app, conn, item, key)
        elif item.kind == "retry":
            app.tasks["ex.retry"].apply_async(
                (item.retries, item.retry_s, item.sleep_s, item.mode == "past_max"),
                task_id=key,
                message_id=key,  # its retries are ``<key>:retry-N`` (checker.retry_key)
                connection=conn,
                retry_policy=POLICY,
            )
        else:
            name = {"work": "ex.work", "inbox": "ex.inbox", "plain": "ex.plain"}[item.kind]
            args = (item.mode, item.sleep_s) if item.kind == "work" else (item.sleep_s,)
            app.tasks[name].apply_async(
                args,
                task_id=key,
                countdown=item.countdown_s or None,
                connection=conn,
                retry_policy=POLICY,
            )
        return True

    def _publish_chain(self, app: Any, item: Item, key: str) -> None:
        from celery import chain

        work = app.tasks["ex.work"]
        chain(
            work.si(mode, item.sleep_s).set(task_id=checker.link_key(key, n))
            for n, mode in enumerate(checker.chain_modes(item))
        ).apply_async(retry_policy=POLICY)

    def _publish_group(self, app: Any, item: Item, key: str) -> None:
        from celery import group

        work = app.tasks["ex.work"]
        group(
            work.si(mode, item.sleep_s).set(task_id=checker.member_key(key, n))
            for n, mode in enumerate(item.members)
        ).apply_async(retry_policy=POLICY)

    def _publish_chord(self, app: Any, item: Item, key: str) -> None:
        from celery import chord

        work = app.tasks["ex.work"]
        members = [checker.member_key(key, n) for n in range(len(item.members))]
        header = [
            work.si(mode, item.sleep_s).set(task_id=member)
            for member, mode in zip(members, item.members, strict=True)
        ]
        body = app.tasks["ex.join"].s(members).set(task_id=checker.chord_body_key(key))
        chord(header, body).apply_async(retry_policy=POLICY)

    def _publish_scoped(self, app: Any, conn: Any, item: Item, key: str) -> None:
        """One message id to both queues of one dedup scope: one message, run once. Confirmed
        once either publish is (the other copy is then a duplicate that may never come)."""
        work = app.tasks["ex.work"]
        failed: Exception | None = None
        published = 0
        for queue in (self.run_.queue, SECOND_QUEUE):
            try:
                work.apply_async(
                    ("ok", item.sleep_s), task_id=key, message_id=key, queue=queue,
                    connection=conn,
                    retry_policy=POLICY,
                )  # fmt: skip
                published += 1
            except Exception as exc:
                failed = exc
        if not published and failed is not None:
            raise failed

    def _enqueue(self, app: Any, item: Item, key: str) -> bool:
        """An ``ok`` ``ex.work`` through the outbox, in a transaction that commits or rolls
        back (README "The outbox": committed, it runs once; rolled back, it never runs)."""
        from sqlalchemy.orm import Session

        from celery_beetle import outbox
        from celery_beetle.outbox.db import engine_for

        assert self.run_.db_url, "outbox items need the run's database"
        if self._db is None:  # this run's database (app._engine keeps one per process)
            self._db = engine_for(self.run_.db_url, pool_size=1)
        options: dict[str, Any] = {"task_id": key}
        if item.countdown_s:
            options["countdown"] = item.countdown_s
        if item.ordering_key:
            options["ordering_key"] = item.ordering_key
        try:
            with Session(self._db) as session, session.begin():
                outbox.apply_async(session, app.tasks["ex.work"], ("ok", item.sleep_s), **options)
                if item.mode == "rollback":
                    raise _RollBack(key)
        except _RollBack:
            self.rolled_back.add(key)
            return False
        return True

    def _publish_bad(self, item: Item, key: str) -> None:
        """An ``ex.work`` message with the defect ``item.mode``, straight to one broker (no
        beetle publisher would write it)."""
        import pika

        run = self.run_
        headers: dict[str, Any] = {"lang": "py", "task": "ex.work", "id": key, "root_id": key,
                                   "retries": 0, "argsrepr": "", "kwargsrepr": ""}  # fmt: skip
        body = json.dumps([["ok", 0.0], {}, {}]).encode()
        message_id: str | None = key
        if item.mode == "undecodable":
            body = b"\x00{not json"
        elif item.mode == "invalid_header":
            headers["x-beetle-expires-at"] = "inf"
        elif item.mode == "no_message_id":
            message_id = None
        properties = pika.BasicProperties(
            content_type="application/json",
            content_encoding="utf-8",
            headers=headers,
            message_id=message_id,
            correlation_id=key,
            delivery_mode=2,
        )
        # a broker down (or destroyed) at that moment: not published, not judged
        connection = run.nodes[item.index % len(run.nodes)].connect(run.vhost)
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", run.queue, body, properties, mandatory=True)
        finally:
            connection.close()
