"""For non-redundant messages beetle:// behaves like pyamqp for what kombu and Celery do.

Like kombu's own t/integration suite, every test runs against both transports:
``pyamqp`` on one broker and ``beetle`` over three.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from celery import Celery
from kombu import Connection, Consumer, Exchange, Producer, Queue

from celery_beetle.testing.rabbit import RabbitNode
from tests.integration.conftest import FAST


@pytest.fixture(params=["pyamqp", "beetle"])
def conn(request, brokers):
    if request.param == "pyamqp":
        node: RabbitNode = brokers.nodes[0]
        url = f"pyamqp://guest:guest@{node.host_port}/{brokers.vhost}"
        options: dict = {"confirm_publish": True}
    else:
        url, options = brokers.beetle_url, dict(FAST)
    with Connection(url, transport_options=options) as connection:
        connection.connect()
        yield connection


def drain(conn, queue, count, timeout=10.0, accept_ack=True, auto_declare=True):
    got = []

    def on_message(body, message):
        got.append((body, message))
        if accept_ack:
            message.ack()

    with Consumer(
        conn.default_channel,
        [queue],
        callbacks=[on_message],
        accept=["json", "text/plain"],
        auto_declare=auto_declare,
    ):
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    return got


def unique(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("kind", ["direct", "topic", "fanout", "headers"])
def test_exchange_types_route_like_rabbitmq(conn, kind):
    exchange = Exchange(unique(kind), kind)
    bind = {"direct": "k", "topic": "a.*", "fanout": "", "headers": ""}[kind]
    args = {"x-match": "all", "h": "1"} if kind == "headers" else None
    queue = Queue(unique("q"), exchange, bind, binding_arguments=args, auto_delete=True)
    producer = Producer(conn.default_channel)
    queue(conn.default_channel).declare()
    route = {"direct": "k", "topic": "a.b", "fanout": "any", "headers": ""}[kind]
    producer.publish({"kind": kind}, exchange=exchange, routing_key=route, headers={"h": "1"})
    producer.publish({"kind": "miss"}, exchange=exchange, routing_key="nope", headers={"h": "2"})
    got = drain(conn, queue, 1, timeout=3)
    bodies = [b for b, _ in got]
    if kind == "fanout":
        assert {"kind": "fanout"} in bodies  # fanout ignores the key: both arrive
    else:
        assert bodies == [{"kind": kind}]


def test_message_ttl_drops_expired_messages(conn):
    queue = Queue(unique("ttl"), message_ttl=0.3, auto_delete=False)
    producer = Producer(conn.default_channel)
    queue(conn.default_channel).declare()
    producer.publish("old", routing_key=queue.name)
    producer.publish("short", routing_key=queue.name, expiration=0.1)
    time.sleep(0.8)
    assert queue(conn.default_channel).get() is None
    queue(conn.default_channel).delete()


def test_priorities_order_one_queue_with_the_primary_strategy(brokers):
    url = brokers.beetle_url + "?publish_strategy=primary"
    with Connection(url, transport_options=FAST) as conn:
        queue = Queue(unique("prio"), max_priority=10)
        queue(conn.default_channel).declare()
        producer = Producer(conn.default_channel)
        for priority in (1, 5, 9, 3):
            producer.publish(priority, routing_key=queue.name, priority=priority)
        got = [m.payload for m in iter(lambda: queue(conn.default_channel).get(no_ack=True), None)]
        assert got == [9, 5, 3, 1]
        queue(conn.default_channel).delete()


def test_reject_with_requeue_redelivers_and_without_drops(conn):
    queue = Queue(unique("rej"))
    queue(conn.default_channel).declare()
    producer = Producer(conn.default_channel)
    producer.publish("again", routing_key=queue.name)
    first = queue(conn.default_channel).get()
    first.reject(requeue=True)
    second = queue(conn.default_channel).get()
    assert second.payload == "again" and second.delivery_info["redelivered"]
    second.reject(requeue=False)
    assert queue(conn.default_channel).get() is None
    producer.publish("acked", routing_key=queue.name)
    got = drain(conn, queue, 1)
    assert [b for b, _ in got] == ["acked"]
    assert queue(conn.default_channel).get() is None
    queue(conn.default_channel).delete()


def test_simple_queue_put_get_len_and_clear(conn):
    name = unique("simple")
    with conn.SimpleQueue(name) as q:
        for i in range(5):
            q.put({"i": i})
        time.sleep(0.2)
        assert len(q) == 5
        assert q.clear() == 5
        q.put({"i": "last"})
        message = q.get(timeout=5)
        assert message.payload == {"i": "last"}
        message.ack()
    Queue(name)(conn.default_channel).delete()


def test_a_server_named_queue_gets_one_name_on_every_broker(conn):
    queue = Queue(exclusive=True)
    declared = queue(conn.default_channel)
    declared.declare()
    assert declared.name
    Producer(conn.default_channel).publish("hi", routing_key=declared.name)
    assert [b for b, _ in drain(conn, declared, 1, auto_declare=False)] == ["hi"]


def test_mandatory_publish_of_an_unroutable_message_calls_on_return(conn):
    returned = []
    producer = Producer(conn.default_channel, on_return=lambda *a: returned.append(a))
    producer.publish("lost", exchange="", routing_key=unique("nobody"), mandatory=True)
    assert returned


@pytest.fixture
def rpc_app(brokers):
    app = Celery("parity", broker=brokers.beetle_url, backend="rpc://", set_as_current=False)
    app.conf.broker_transport_options = FAST
    yield app


def test_remote_control_events_and_rpc_results_work_with_a_worker(brokers, worker, rpc_app):
    w = worker(brokers.beetle_url, extra_env={"BEETLE_TEST_BACKEND": "rpc://"}, extra_args=("-E",))
    assert w.alive()
    replies = rpc_app.control.ping(timeout=3)
    assert len(replies) == 1
    stats = rpc_app.control.inspect(timeout=3).registered()
    assert any("it.add" in tasks for tasks in stats.values())
    events: list[str] = []
    with rpc_app.connection_for_read() as conn:
        receiver = rpc_app.events.Receiver(conn, handlers={"*": lambda e: events.append(e["type"])})
        capture = threading.Thread(target=_capture_until, args=(receiver, events), daemon=True)
        capture.start()
        time.sleep(1)  # the receiver's queue exists before the task runs
        result = rpc_app.send_task("it.add", (2, 3))
        assert result.get(timeout=15) == 5
        capture.join(15)
    assert "task-succeeded" in events


def _capture_until(receiver, events: list[str], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    for _ in receiver.consume(limit=None, timeout=timeout, safety_interval=0.5):
        if "task-succeeded" in events or time.monotonic() > deadline:
            receiver.should_stop = True
