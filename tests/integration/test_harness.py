"""The harness's faults are real: chaos tests rely on kill, pause and the proxy doing what they say.

Every check here goes through pika, a client independent of the transport under test.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
import redis
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from celery_beetle.testing.ports import process_alive
from celery_beetle.testing.proxy import TcpProxy
from celery_beetle.testing.rabbit import BrokerSet, RabbitNode
from celery_beetle.testing.redis_server import RedisServer

FAST_FAIL = {"socket_timeout": 1, "stack_timeout": 2}
# A handshake timeout surfaces as pika's connector exception, not as an AMQPConnectionError.
CONNECT_FAILED = (pika.exceptions.AMQPConnectionError, AMQPConnectorException)


def _publish_persistent(node: RabbitNode, vhost: str, queue: str, bodies: list[bytes]) -> None:
    with node.connect(vhost) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        for body in bodies:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def _params_via(
    proxy: TcpProxy, node: RabbitNode, vhost: str, **options: float
) -> pika.ConnectionParameters:
    """Parameters that reach `node` through `proxy`."""
    params = node.connection_parameters(vhost, **options)
    params.port = proxy.port
    return params


def test_every_node_accepts_amqp_in_the_test_vhost(brokers: BrokerSet) -> None:
    for node in brokers.nodes:
        _publish_persistent(node, brokers.vhost, "hello", [node.host_port.encode()])
    for node in brokers.nodes:
        [(_, _, body)] = node.get_messages(brokers.vhost, "hello")
        assert body == node.host_port.encode()  # each node is its own broker


def test_beetle_url_names_every_node_and_the_vhost(brokers: BrokerSet) -> None:
    first, _, third = (node.host_port for node in brokers.nodes)
    assert brokers.url_for(0, 2) == f"beetle://guest:guest@{first},{third}/{brokers.vhost}"
    assert brokers.beetle_url.count(",") == len(brokers.nodes) - 1


def test_queue_depths_count_ready_and_unacked_messages(brokers: BrokerSet) -> None:
    node = brokers.nodes[1]
    _publish_persistent(node, brokers.vhost, "depths", [b"1", b"2", b"3"])
    with node.connect(brokers.vhost) as connection:
        method, _, _ = connection.channel().basic_get("depths", auto_ack=False)
        assert method is not None
        assert node.queue_depths(brokers.vhost) == {"depths": (2, 1)}
        # every node's at once, in node order (the one queue is on node 1 only)
        assert brokers.queue_depths() == [{}, {"depths": (2, 1)}, {}]
        assert brokers.queue_depths(1, 2) == [{"depths": (2, 1)}, {}]
    assert node.queue_depths(brokers.vhost) == {"depths": (3, 0)}  # requeued on close


def test_kill_then_restart_keeps_persistent_messages_of_a_durable_queue(
    brokers: BrokerSet,
) -> None:
    node = brokers.nodes[0]
    _publish_persistent(node, brokers.vhost, "durable", [b"a", b"b", b"c"])
    node.write_definitions_to_disk()  # else the kill can take the queue's declaration along
    old_pid, port = node.pid, node.port

    node.kill()
    assert not process_alive(old_pid) and not node.is_running
    with pytest.raises(CONNECT_FAILED):
        node.connect(brokers.vhost, **FAST_FAIL)

    node.restart()
    assert node.pid != old_pid and node.port == port
    assert [body for _, _, body in node.get_messages(brokers.vhost, "durable")] == [
        b"a",
        b"b",
        b"c",
    ]


def test_a_paused_node_times_out_connections_until_resumed(brokers: BrokerSet) -> None:
    node = brokers.nodes[2]
    node.pause()
    started = time.monotonic()
    with pytest.raises(CONNECT_FAILED):
        node.connect(brokers.vhost, **FAST_FAIL)
    assert time.monotonic() - started < 10
    assert node.is_running  # hung, not dead

    node.resume()
    node.connect(brokers.vhost).close()


def test_redis_with_aof_keeps_a_key_across_kill_and_restart(redis_aof: RedisServer) -> None:
    with redis_aof.client() as client:
        client.set("survivor", "yes")
    old_pid = redis_aof.pid

    redis_aof.kill()
    assert not process_alive(old_pid)

    redis_aof.restart()
    with redis_aof.client() as client:
        assert client.get("survivor") == b"yes"


def test_a_paused_redis_times_out_clients_until_resumed(redis_aof: RedisServer) -> None:
    redis_aof.pause()
    with redis_aof.client(socket_timeout=0.5) as client, pytest.raises(redis.TimeoutError):
        client.ping()
    redis_aof.resume()
    with redis_aof.client() as client:
        assert client.ping()


def test_proxy_cut_resets_connections_and_refuses_new_ones_until_restored(
    brokers: BrokerSet, tcp_proxy: Callable[[RabbitNode], TcpProxy]
) -> None:
    node = brokers.nodes[0]
    proxy = tcp_proxy(node)
    connection = pika.BlockingConnection(_params_via(proxy, node, brokers.vhost))
    channel = connection.channel()

    proxy.cut()
    with pytest.raises(pika.exceptions.AMQPError):
        channel.queue_declare("after-cut")
    with pytest.raises(CONNECT_FAILED):
        pika.BlockingConnection(_params_via(proxy, node, brokers.vhost, **FAST_FAIL))

    proxy.restore()
    with pika.BlockingConnection(_params_via(proxy, node, brokers.vhost)) as again:
        again.channel().queue_declare("after-restore")


def test_proxy_stall_hangs_new_connections_and_keeps_open_ones_until_restored(
    brokers: BrokerSet, tcp_proxy: Callable[[RabbitNode], TcpProxy]
) -> None:
    node = brokers.nodes[1]
    proxy = tcp_proxy(node)
    held = pika.BlockingConnection(_params_via(proxy, node, brokers.vhost))

    proxy.stall()
    started = time.monotonic()
    with pytest.raises(CONNECT_FAILED):
        pika.BlockingConnection(_params_via(proxy, node, brokers.vhost, **FAST_FAIL))
    assert time.monotonic() - started >= 1  # it hung until the client gave up
    assert proxy.connection_count >= 1

    proxy.restore()
    held.channel().queue_declare("after-stall")  # the held connection survived the stall
    held.close()
