"""Where messages land: checked with pika on each broker, not through the transport."""

from __future__ import annotations

import time

import pytest
from kombu import Exchange, Producer, Queue

from celery_beetle.testing.waiting import wait_until
from kombu_beetle import FLAGS_HEADER

QUEUE = Queue("work", Exchange("work", "direct"), "work")


def depths(brokers, queue="work"):
    return [depths.get(queue, (0, 0))[0] for depths in brokers.queue_depths()]


def test_redundant_publish_lands_on_exactly_two_brokers(brokers, connect):
    conn = connect()
    producer = Producer(conn.default_channel)
    for i in range(30):
        producer.publish(
            {"i": i},
            exchange=QUEUE.exchange,
            routing_key="work",
            declare=[QUEUE],
            headers={FLAGS_HEADER: 1},
        )
    assert sum(depths(brokers)) == 60
    by_id: dict[str, list[int]] = {}
    for index, node in enumerate(brokers.nodes):
        for _, props, _ in node.get_messages(brokers.vhost, "work"):
            by_id.setdefault(props.message_id, []).append(index)
    assert len(by_id) == 30
    assert all(len(set(where)) == 2 for where in by_id.values())


def test_redundant_copies_share_one_message_id_and_the_beetle_headers(brokers, connect):
    conn = connect()
    Producer(conn.default_channel).publish(
        "x",
        exchange=QUEUE.exchange,
        routing_key="work",
        declare=[QUEUE],
        headers={FLAGS_HEADER: 1, "mine": "kept"},
        message_id="outbox-42",
    )
    copies = [m for node in brokers.nodes for m in node.get_messages(brokers.vhost, "work")]
    assert [props.message_id for _, props, _ in copies] == ["outbox-42", "outbox-42"]
    headers = copies[0][1].headers
    assert headers["mine"] == "kept"
    assert headers["x-beetle-format"] == 1 and headers[FLAGS_HEADER] == 1
    assert headers["x-beetle-expires-at"] > headers["x-beetle-published-at"] / 1000


@pytest.mark.parametrize("size", [0, 1_000, 300_000], ids=["empty", "small", "over-frame-max"])
def test_both_copies_carry_the_same_body_and_properties_whatever_the_size(brokers, connect, size):
    body = "é" * size
    Producer(connect().default_channel).publish(
        body,
        routing_key="work",
        declare=[QUEUE],
        headers={FLAGS_HEADER: 1, "nested": {"list": [1, "two", None]}},
        priority=3,
        correlation_id="c-1",
    )
    copies = [m for node in brokers.nodes for m in node.get_messages(brokers.vhost, "work")]
    assert len(copies) == 2
    (_, first, first_body), (_, second, second_body) = copies
    assert first_body == second_body == body.encode()
    assert first.headers == second.headers and first.headers["nested"]["list"] == [1, "two", None]
    assert (first.priority, first.correlation_id, first.message_id) == (3, "c-1", second.message_id)


def test_a_queue_marked_redundant_by_option_gets_two_copies(brokers, connect):
    conn = connect(redundant_queues="work")
    Producer(conn.default_channel).publish(
        "x", exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE]
    )
    assert sorted(depths(brokers)) == [0, 1, 1]


def test_round_robin_spreads_plain_messages_one_copy_each(brokers, connect):
    conn = connect()
    producer = Producer(conn.default_channel)
    for i in range(30):
        producer.publish({"i": i}, exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE])
    assert depths(brokers) == [10, 10, 10]


def test_plain_messages_keep_exactly_their_headers_and_get_a_message_id(brokers, connect):
    conn = connect()
    Producer(conn.default_channel).publish(
        "x", exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE], headers={"a": 1}
    )
    [(_, props, _)] = [m for n in brokers.nodes for m in n.get_messages(brokers.vhost, "work")]
    assert props.headers == {"a": 1}
    assert props.message_id


def test_primary_strategy_sends_every_plain_message_to_the_first_broker(brokers, connect):
    conn = connect(publish_strategy="primary")
    producer = Producer(conn.default_channel)
    for i in range(10):
        producer.publish(i, exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE])
    assert depths(brokers) == [10, 0, 0]


def test_declarations_reach_every_broker(brokers, connect):
    conn = connect()
    QUEUE(conn.default_channel).declare()
    for depths in brokers.queue_depths():
        assert "work" in depths


def test_a_dead_broker_is_skipped_and_the_publish_still_gets_two_copies(brokers, connect):
    conn = connect()
    producer = Producer(conn.default_channel)
    producer.publish("warm", exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE])
    brokers.nodes[0].kill()
    for i in range(10):
        producer.publish(i, exchange=QUEUE.exchange, routing_key="work", headers={FLAGS_HEADER: 1})
    live = [depths["work"][0] for depths in brokers.queue_depths(1, 2)]
    assert sum(live) >= 20  # both copies of every message on the two live brokers


@pytest.mark.parametrize("redundant", [True, False])
def test_with_every_broker_down_publish_names_the_brokers_and_recovers(brokers, connect, redundant):
    from kombu_beetle import NoBrokerAvailable

    conn = connect(brokers.url_for(0, 1))
    producer = Producer(conn.default_channel)
    producer.publish("warm", exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE])
    headers = {FLAGS_HEADER: 1} if redundant else {}
    brokers.nodes[0].kill()
    brokers.nodes[1].kill()
    with pytest.raises(NoBrokerAvailable) as info:
        producer.publish("x", exchange=QUEUE.exchange, routing_key="work", headers=headers)
    assert brokers.nodes[0].host_port in str(info.value)
    assert brokers.nodes[1].host_port in str(info.value)
    brokers.nodes[1].restart()
    # kombu's retry policy applies, since NoBrokerAvailable is a recoverable connection error
    producer.publish(
        "after",
        exchange=QUEUE.exchange,
        routing_key="work",
        headers=headers,
        retry=True,
        retry_policy={
            "max_retries": 20,
            "interval_start": 0.2,
            "interval_step": 0.2,
            "interval_max": 0.5,
        },
    )
    # the confirm comes once the queue took it; list_queues is read until it shows it (each
    # read starts an Erlang VM for rabbitmqctl: seconds apiece on a loaded machine)
    back = brokers.nodes[1]
    landed = wait_until(lambda: back.queue_depths(brokers.vhost).get("work", (0, 0))[0] >= 1, 30)
    if not landed:  # printed whole: an assertion's message is cut short in the report
        print("depths on the broker started again:", back.queue_depths(brokers.vhost))
        print(back.ctl("list_bindings", "-p", brokers.vhost))
        print(back.ctl("list_connections", "-q", "name", "state", "vhost"))
        print(back.log_tail())
    assert landed, "the message published after the restart is not on the broker started again"


def test_a_connection_kombu_makes_again_declares_again_what_the_one_before_declared(
    brokers, connect
):
    conn = connect(brokers.url_for(1))
    producer = Producer(conn.default_channel)
    producer.publish("warm", exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE])
    # a node killed right after a bind may come back without it (its record not yet on
    # disk); a message sent to the exchange would then route nowhere and still be confirmed
    with brokers.nodes[1].connect(brokers.vhost) as direct:
        direct.channel().queue_unbind("work", "work", "work")
    conn.collect()  # what kombu's retry does after a connection error, before connecting again
    Producer(conn.default_channel).publish("after", exchange=QUEUE.exchange, routing_key="work")
    assert brokers.nodes[1].queue_depths(brokers.vhost)["work"][0] == 2


def test_tracing_writes_one_published_event_per_copy_of_a_redundant_message(
    brokers, connect, tmp_path
):
    import json

    from kombu_beetle.trace import flush_all

    conn = connect(trace_dir=str(tmp_path))
    producer = Producer(conn.default_channel)
    producer.publish(
        "r", exchange=QUEUE.exchange, routing_key="work", declare=[QUEUE],
        headers={FLAGS_HEADER: 1}, message_id="m-redundant",
    )  # fmt: skip
    # plain messages (plain tasks, Celery events, replies) are not audited: no worker
    # traces their end, so they would read as lost
    producer.publish("p", exchange=QUEUE.exchange, routing_key="work", message_id="m-plain")
    flush_all()
    events = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.open()]
    published = [(e["message_id"], e["broker"], e["detail"]["confirmed"]) for e in events]
    assert sorted(m for m, _, _ in published) == ["m-redundant", "m-redundant"]
    assert all(confirmed for _, _, confirmed in published)
    assert len({b for _, b, _ in published}) == 2
    assert {e["queue"] for e in events} == {"work"}


def test_declarations_are_replayed_on_a_broker_that_comes_back_empty(brokers, connect):
    transient = Queue(
        "transient", Exchange("transient", "direct", durable=False), "t", durable=False
    )
    conn = connect()
    producer = Producer(conn.default_channel)
    producer.publish("a", exchange=transient.exchange, routing_key="t", declare=[transient])
    brokers.nodes[2].kill()
    brokers.nodes[2].restart()  # a non-durable queue does not survive the restart
    assert "transient" not in brokers.nodes[2].queue_depths(brokers.vhost)

    def replayed() -> bool:
        producer.publish("b", exchange=transient.exchange, routing_key="t")
        return "transient" in brokers.nodes[2].queue_depths(brokers.vhost)

    deadline = time.monotonic() + 20
    while not replayed():
        assert time.monotonic() < deadline, "the queue was not declared again"
        time.sleep(0.3)


def test_subscription_only_brokers_are_consumed_from_but_never_published_to(brokers, connect):
    old = brokers.nodes[2]
    conn = connect(brokers.url_for(0, 1), additional_subscription_brokers=old.host_port)
    channel = conn.default_channel
    QUEUE(channel).declare()
    producer = Producer(channel)
    for i in range(12):
        producer.publish(
            i, exchange=QUEUE.exchange, routing_key="work", headers={FLAGS_HEADER: i % 2}
        )
    assert old.queue_depths(brokers.vhost)["work"][0] == 0
    # a message left on the old broker is drained through the same connection
    with old.connect(brokers.vhost) as blocking:
        blocking.channel().basic_publish("work", "work", b'"left-over"')
    bodies = []
    while (message := QUEUE(channel).get(no_ack=True)) is not None:
        bodies.append(message.payload)
    assert '"left-over"' in bodies  # raw bytes from pika, no content type


def test_a_message_the_worker_moves_on_is_not_traced_as_a_new_publish(brokers, connect, tmp_path):
    import json

    from kombu_beetle.envelope import REPUBLISHED_HEADER
    from kombu_beetle.trace import flush_all

    conn = connect(trace_dir=str(tmp_path))
    Producer(conn.default_channel).publish(
        "to the delay queue", routing_key="work.delay.500", declare=[Queue("work.delay.500")],
        headers={FLAGS_HEADER: 1, REPUBLISHED_HEADER: 1}, message_id="m-moved",
    )  # fmt: skip
    flush_all()
    events = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.open()]
    assert [e for e in events if e["message_id"] == "m-moved"] == []


def _publish_bytes(conn, size: int, **options) -> None:
    Producer(conn.default_channel).publish(
        b"x" * size,
        exchange=QUEUE.exchange,
        routing_key="work",
        declare=[QUEUE],
        content_type="application/octet-stream",
        content_encoding="binary",
        message_id=f"m-{size}",
        **options,
    )


@pytest.mark.parametrize("redundant", [True, False], ids=["redundant", "plain"])
@pytest.mark.parametrize("limit", [1_000, 200_000], ids=["one-frame", "over-frame-max"])
def test_a_body_over_max_message_bytes_is_refused_unsent_and_no_broker_is_blamed(
    brokers, connect, limit, redundant
):
    from kombu_beetle import MessageTooLarge

    conn = connect(max_message_bytes=limit)
    headers = {FLAGS_HEADER: 1} if redundant else {}
    with pytest.raises(MessageTooLarge, match=f"m-{limit + 1}.*max_message_bytes"):
        _publish_bytes(conn, limit + 1, headers=headers, retry=True)
    assert len(conn.connection.brokers.live()) == len(brokers.nodes)
    assert depths(brokers) == [0, 0, 0]
    _publish_bytes(conn, limit, headers=headers)  # exactly at the limit goes through
    assert sum(depths(brokers)) == (2 if redundant else 1)
    bodies = [
        body for node in brokers.nodes for _, _, body in node.get_messages(brokers.vhost, "work")
    ]
    assert {len(body) for body in bodies} == {limit}


def test_the_default_limit_refuses_a_body_over_16_mib_before_writing_it(brokers, connect):
    from kombu_beetle import MessageTooLarge

    conn = connect()
    with pytest.raises(MessageTooLarge, match="16777217-byte body, over the 16777216-byte limit"):
        _publish_bytes(conn, 16 * 1024 * 1024 + 1, headers={FLAGS_HEADER: 1})
    assert len(conn.connection.brokers.live()) == len(brokers.nodes)
    assert depths(brokers) == [0, 0, 0]


def test_celery_does_not_retry_a_task_message_over_the_limit(brokers):
    from celery import Celery

    from kombu_beetle import MessageTooLarge
    from tests.integration.conftest import FAST

    app = Celery("big", broker=brokers.beetle_url, set_as_current=False)
    app.conf.broker_transport_options = {**FAST, "max_message_bytes": 10_000}
    app.conf.task_default_queue = "work"
    try:
        with pytest.raises(MessageTooLarge, match="max_message_bytes"):
            app.send_task("big.task", args=["x" * 20_000])
        app.send_task("small.task", args=["x" * 100])
    finally:
        app.close()
    assert sum(depths(brokers)) == 1
