"""Celery's events (what Flower and ``celery events`` count) show one run per message."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

from kombu import Connection

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts


def test_redundant_messages_show_one_received_and_one_succeeded_event_each(
    brokers, client, eo_worker
):
    conf = {"worker_send_task_events": True}
    worker = eo_worker(extra_env={"BEETLE_TEST_CONF": json.dumps(conf)})
    app = client()
    seen: Counter[str] = Counter()
    ids: dict[str, Counter[str]] = {}
    ready = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind.startswith("task-"):
            seen[kind] += 1
            ids.setdefault(event["uuid"], Counter())[kind] += 1

    receivers: list[Any] = []

    def listen() -> None:
        with Connection(
            brokers.beetle_url, transport_options=app.conf.broker_transport_options
        ) as conn:
            receiver = app.events.Receiver(conn, handlers={"*": on_event})
            receiver.on_consume_ready = lambda *args, **kwargs: ready.set()
            receivers.append(receiver)
            receiver.capture(limit=None, timeout=None, wakeup=False)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(15)
    items = range(20)
    for item in items:
        app.tasks["eo.record"].delay(item)
    assert wait_until(lambda: set(counts([worker])) == set(items), timeout=30)
    assert wait_until(lambda: seen["task-succeeded"] >= 20, timeout=15)
    receivers[0].should_stop = True
    listener.join(5)
    assert counts([worker], "start") == dict.fromkeys(items, 1), "each ran once"
    # both copies reached the worker, the gate dropped one of each: Celery never saw it
    assert seen["task-received"] == seen["task-started"] == seen["task-succeeded"] == 20
    assert all(c["task-received"] == 1 for c in ids.values())
    assert "task-beetle-dropped" not in seen
