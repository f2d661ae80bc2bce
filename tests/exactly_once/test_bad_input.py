"""Bad input is dead-lettered (or, if expired, dropped) with a reason; the worker carries on."""

from __future__ import annotations

import json
import time
import uuid

import pika

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import take_dead_letters


def _publish(node, vhost: str, *, task: str, body: bytes, message_id: str | None, **headers):
    task_id = str(uuid.uuid4())
    properties = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        message_id=message_id,
        delivery_mode=2,
        headers={"lang": "py", "task": task, "id": task_id, **headers},
    )
    connection = node.connect(vhost)
    try:
        connection.channel().basic_publish("", "celery", body, properties)
    finally:
        connection.close()
    return task_id


def _body(*args) -> bytes:
    return json.dumps([list(args), {}, {"callbacks": None, "errbacks": None}]).encode()


def _dead_letters(brokers) -> dict[str, dict]:
    found = {}
    for node, depths in zip(brokers.nodes, brokers.queue_depths(), strict=True):
        if "celery.dead" in depths:
            for _, properties, _ in node.get_messages(brokers.vhost, "celery.dead"):
                found[properties.headers["id"]] = properties.headers
    return found


NO_GRACE = {"BEETLE_TEST_CONF": json.dumps({"beetle_unknown_task_grace": 0})}


def test_bad_input_is_dead_lettered_or_dropped_with_a_reason_and_the_worker_keeps_running(
    brokers, client, eo_worker
):
    worker = eo_worker(extra_env=NO_GRACE)
    node, vhost = brokers.nodes[0], brokers.vhost
    no_id = _publish(node, vhost, task="eo.record", body=_body(101), message_id=None)
    unknown = _publish(node, vhost, task="eo.nope", body=_body(102), message_id="m-102")
    garbled = _publish(node, vhost, task="eo.record", body=b"{not json", message_id="m-103")
    _publish(
        node,
        vhost,
        task="eo.record",
        body=_body(104),
        message_id="m-104",
        **{"x-beetle-expires-at": int(time.time()) - 10},
    )
    client().tasks["eo.record"].delay(105)
    assert wait_until(lambda: counts([worker])[105] == 1, timeout=20)
    time.sleep(0.5)
    assert worker.alive()
    assert set(counts([worker], "start")) == {105}
    dead = _dead_letters(brokers)
    assert dead[no_id]["x-beetle-dead-reason"] == "no_message_id"
    assert dead[unknown]["x-beetle-dead-reason"] == "unknown_task"
    assert dead[garbled]["x-beetle-dead-reason"] == "undecodable"
    assert len(dead) == 3, "the expired message is dropped, not dead-lettered"
    for depths in brokers.queue_depths():
        assert depths.get("celery", (0, 0)) == (0, 0)


def test_both_copies_of_bad_input_give_one_dead_letter(brokers, client, eo_worker):
    worker = eo_worker(extra_env=NO_GRACE)
    vhost = brokers.vhost
    for node in brokers.nodes[:2]:  # the two copies of a redundant message
        _publish(node, vhost, task="eo.nope", body=_body(201), message_id="m-201", id="t-201")
        _publish(node, vhost, task="eo.record", body=b"{nope", message_id="m-202", id="t-202")
    client().tasks["eo.record"].delay(203)
    assert wait_until(lambda: counts([worker])[203] == 1, timeout=20)

    def drained() -> bool:
        return all(depths.get("celery", (0, 0)) == (0, 0) for depths in brokers.queue_depths())

    assert wait_until(drained, timeout=10)
    dead = take_dead_letters(brokers)  # the two copies of one dead letter count once
    reasons = [h["x-beetle-dead-reason"] for hs in dead.values() for h in hs]
    assert sorted(reasons) == ["undecodable", "unknown_task"]
    assert worker.alive()


def test_a_task_only_newer_workers_know_waits_for_them_during_a_rolling_deploy(
    brokers, client, eo_worker
):
    """An older worker hands an unknown task back (within its grace) instead of failing it,
    so the newer worker that starts later runs it, once, and nothing is dead-lettered."""
    grace = {"BEETLE_TEST_CONF": json.dumps({"beetle_unknown_task_grace": 60})}
    old = eo_worker(extra_env=grace)
    newer = client(newer=True).tasks["eo.newer"]
    for item in range(301, 311):
        newer.delay(item)
    assert wait_until(lambda: "handing" in old.log_text(), timeout=20)
    time.sleep(2)  # several hand-backs: none may fail, run or dead-letter it
    assert counts([old], "start") == {}
    assert _dead_letters(brokers) == {}
    new = eo_worker(extra_env={**grace, "BEETLE_TEST_NEWER": "1"})
    assert wait_until(lambda: len(counts([old, new])) == 10, timeout=60)
    time.sleep(1)
    assert counts([old, new]) == {item: 1 for item in range(301, 311)}
    assert _dead_letters(brokers) == {}
    assert old.alive() and new.alive()
