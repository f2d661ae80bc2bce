"""Queue properties as policies on every broker (:mod:`celery_beetle.ops.policies`)."""

from __future__ import annotations

import threading

import pytest
import redis

from celery_beetle.ops.applier import FleetLock, PolicyApplier
from celery_beetle.ops.policies import PolicyConfig, apply, plan
from celery_beetle.testing.waiting import wait_until

pytestmark = pytest.mark.integration

CONFIG = PolicyConfig.from_mapping(
    {"default": {"max_length": 1000}, "queues": {"orders": {"message_ttl_ms": 200}}}
)


def declare(node, vhost, *queues):  # type: ignore[no-untyped-def]
    conn = node.connect(vhost)
    try:
        channel = conn.channel()
        for queue in queues:
            channel.queue_declare(queue, durable=True)
    finally:
        conn.close()


def publish(node, vhost, queue, body=b"x"):  # type: ignore[no-untyped-def]
    conn = node.connect(vhost)
    try:
        conn.channel().basic_publish("", queue, body)
    finally:
        conn.close()


def depth(node, vhost, queue):  # type: ignore[no-untyped-def]
    return node.queue_depths(vhost).get(queue, (0, 0))[0]


def test_policy_routes_expired_and_rejected_messages_to_the_queues_own_dead_queue_on_each_broker(
    brokers, management
):
    for node in brokers.nodes:
        declare(node, brokers.vhost, "orders", "mail")
    plans = apply(management(), ["orders", "mail"], CONFIG)
    assert [p.error for p in plans] == [None] * 3
    for node in brokers.nodes:
        publish(node, brokers.vhost, "orders", b"expires")
        publish(node, brokers.vhost, "mail", b"rejected")
        conn = node.connect(brokers.vhost)
        channel = conn.channel()
        method, _, _ = channel.basic_get("mail")
        channel.basic_reject(method.delivery_tag, requeue=False)
        conn.close()
    for node in brokers.nodes:
        assert wait_until(lambda n=node: depth(n, brokers.vhost, "orders.dead") == 1, 10)
        assert wait_until(lambda n=node: depth(n, brokers.vhost, "mail.dead") == 1, 10)
        (_, props, body), *_ = node.get_messages(brokers.vhost, "orders.dead")
        assert body == b"expires" and props.headers["x-death"][0]["reason"] == "expired"
        (_, props, body), *_ = node.get_messages(brokers.vhost, "mail.dead")
        assert body == b"rejected" and props.headers["x-death"][0]["reason"] == "rejected"


def test_plan_shows_drift_after_a_config_change_apply_fixes_it_and_a_second_apply_writes_nothing(
    brokers, management
):
    clients = management()
    first = apply(clients, ["orders"], CONFIG)
    assert sum(p.writes for p in first) == 6  # a policy and orders.dead on three brokers
    changed = PolicyConfig.from_mapping({"queues": {"orders": {"message_ttl_ms": 60_000}}})
    drift = plan(clients, ["orders"], changed)
    assert [[c.kind for c in p.changes] for p in drift] == [["update"]] * 3
    assert '"message-ttl":200' in drift[0].changes[0].describe()
    assert '"message-ttl":60000' in drift[0].changes[0].describe()
    assert sum(p.writes for p in apply(clients, ["orders"], changed)) == 3
    writes_before = sum(c.writes for c in clients)
    again = apply(clients, ["orders"], changed)
    assert [p.changes for p in again] == [[]] * 3
    assert sum(c.writes for c in clients) == writes_before
    policy = next(p for p in clients[2].policies() if p["name"] == "beetle.orders")
    assert policy["definition"] == {
        "dead-letter-exchange": "",
        "dead-letter-routing-key": "orders.dead",
        "message-ttl": 60000,
    }


def test_plan_reports_x_arguments_and_higher_priority_policies_that_win_over_ours(
    brokers, management
):
    node = brokers.nodes[0]
    conn = node.connect(brokers.vhost)
    conn.channel().queue_declare("orders", durable=True, arguments={"x-message-ttl": 5})
    conn.close()
    client = management(0)[0]
    theirs = {"pattern": "^ord", "definition": {"max-length": 1}, "priority": 99}
    client.put_policy("theirs", theirs)
    (broker_plan,) = plan([client], ["orders"], CONFIG)
    text = "\n".join(d.describe() for d in broker_plan.drift)
    assert "x-message-ttl=5" in text and "client arguments beat policies" in text
    assert "'theirs' (priority 99)" in text and "shadows" in text


def test_an_unreachable_broker_is_reported_and_gets_its_policies_when_it_returns(
    brokers, management
):
    clients = management()
    brokers.nodes[2].stop()
    applier = PolicyApplier(clients, ["orders"], CONFIG, interval_s=0.3).start()
    try:
        assert wait_until(lambda: clients[2].name in applier.unreachable, 10)
        assert [p["name"] for p in clients[0].policies()] == ["beetle.orders"]
        assert [p["name"] for p in clients[1].policies()] == ["beetle.orders"]
        brokers.nodes[2].start()
        assert wait_until(lambda: clients[2].name not in applier.unreachable, 20)
        assert [p["name"] for p in clients[2].policies()] == ["beetle.orders"]
        assert clients[2].queue("orders.dead") is not None
    finally:
        applier.stop()


def test_a_fleet_starting_together_makes_one_round_of_writes_not_one_per_worker(
    brokers, management, redis_url
):
    client = redis.Redis.from_url(redis_url)
    key = "beetle:ops:policies:" + CONFIG.fingerprint(["orders", "mail"])
    appliers = [
        PolicyApplier(
            management(),
            ["orders", "mail"],
            CONFIG,
            lock=FleetLock(client, key, ttl_ms=60_000),
            owner=f"worker-{i}",
        )
        for i in range(40)
    ]
    barrier = threading.Barrier(len(appliers))

    def start(applier: PolicyApplier) -> None:
        barrier.wait()
        applier.run_once()

    threads = [threading.Thread(target=start, args=(a,)) for a in appliers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    writes = sum(c.writes for a in appliers for c in a.clients)
    reads = sum(c.reads for a in appliers for c in a.clients)
    assert sum(a.rounds for a in appliers) == 1
    assert writes == 12  # two policies and two dead queues on three brokers
    assert reads == 6  # the one round read each broker's policies and queues
