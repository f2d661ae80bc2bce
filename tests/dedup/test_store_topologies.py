"""The store behind Redis Sentinel and Redis Cluster URLs, on real local servers.

A Sentinel monitors the session's throwaway Redis; a one-node cluster owns every slot.
The same claim → complete → duplicate sequence must work through both clients, with every
key of a message in one slot (the hash tag in ``beetle:{scope:message_id}``; see
:mod:`celery_beetle.store.keys`). With
``wait_replicas`` a write counts only once a replica has it, still in one round trip.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_beetle.store import RedisStore, ReplicaAckTimeout, connect, wall_clock_ms
from celery_beetle.store.health import STORE_ERRORS, RedisProbe
from celery_beetle.store.outcome import Fence, Gate, Limits
from celery_beetle.store.state import MessageFacts
from celery_beetle.testing.ports import free_port
from celery_beetle.testing.redis_server import redis_server_binary
from celery_beetle.testing.waiting import wait_until

pytestmark = pytest.mark.integration


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    binary = redis_server_binary()
    assert binary is not None
    with log.open("wb") as out:
        return subprocess.Popen([binary, *args], stdout=out, stderr=subprocess.STDOUT)


def _wait(check, what: str, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.exceptions.RedisError:
            pass
        time.sleep(0.1)
    pytest.fail(f"{what} did not come up within {timeout} s")


@pytest.fixture
def sentinel_url(redis_server, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    conf = tmp_path / "sentinel.conf"  # a sentinel rewrites its own config file
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\n"
        f"sentinel monitor beetle {redis_server.host} {redis_server.port} 1\n"
    )
    proc = _start([str(conf), "--sentinel"], tmp_path / "sentinel.log")
    probe = redis.Redis(port=port, socket_timeout=1)
    _wait(lambda: probe.sentinel_get_master_addr_by_name("beetle"), "the sentinel")
    yield f"redis+sentinel://127.0.0.1:{port}/beetle/0"
    proc.kill()
    proc.wait()


@pytest.fixture
def cluster_url(tmp_path: Path) -> Iterator[str]:
    for attempt in range(3):  # its bus port (+10000) is in the ephemeral range: may clash
        port = free_port(also_at=10000)
        node_dir = tmp_path / f"node{attempt}"
        node_dir.mkdir()
        proc = _start(
            ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir), "--save", "",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
            node_dir / "cluster.log",
        )  # fmt: skip
        probe = redis.Redis(port=port, socket_timeout=1)
        _wait(lambda p=proc, r=probe: p.poll() is not None or r.ping(), "the cluster node")
        if proc.poll() is None:
            break
    else:
        pytest.fail(f"the cluster node did not start: {(node_dir / 'cluster.log').read_text()}")
    probe.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    _wait(lambda: b"cluster_state:ok" in probe.execute_command("CLUSTER", "INFO"), "the cluster")
    yield f"redis+cluster://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def _claim_complete_and_drop(store: RedisStore) -> None:
    facts = MessageFacts("orders", "m-topology", expires_at_ms=wall_clock_ms() + 60_000)
    claim = store.claim(facts, Limits(), "test:1")
    assert claim.acquired
    assert store.complete(facts, claim.token).outcome is Fence.OK
    assert store.gate(facts).outcome is Gate.DROP_DUPLICATE
    assert store.ttl_ms(facts.queue, facts.message_id) > 0


def test_the_store_works_through_a_sentinel_url(sentinel_url):
    store = RedisStore.from_url(sentinel_url)
    _claim_complete_and_drop(store)
    store.close()


def test_the_store_works_through_a_cluster_url(cluster_url):
    store = RedisStore.from_url(cluster_url)
    _claim_complete_and_drop(store)
    assert store.key("orders", "m-topology") == "beetle:{orders:m-topology}"
    store.close()


def test_on_a_cluster_an_old_key_is_read_only_where_it_shares_the_record_s_slot(cluster_url):
    store = RedisStore.from_url(cluster_url)
    client = store.client
    colon = MessageFacts("orders:eu", "m-1", expires_at_ms=wall_clock_ms() + 60_000)
    keys = store.record_keys(colon.scope, colon.message_id)
    assert keys == ["beetle:{orders:eu:m-1}#9", "beetle:{orders:eu:m-1}"]
    assert client.keyslot(keys[0]) == client.keyslot(keys[1])
    client.hset(keys[1], mapping={"s": "c", "a": 1, "t": 1})  # the previous version's
    assert store.gate(colon).outcome is Gate.DROP_DUPLICATE
    assert store.claim(colon, Limits(), "test:1").outcome.value == "already_done"
    long_id = MessageFacts("orders", "x" * 255, expires_at_ms=wall_clock_ms() + 60_000)
    assert len(store.record_keys(long_id.scope, long_id.message_id)) == 1  # another slot
    _claim_complete_and_drop(store)
    claim = store.claim(long_id, Limits(), "test:1")
    assert claim.acquired and store.complete(long_id, claim.token).ok
    store.close()


def test_with_wait_replicas_each_write_is_one_round_trip_acknowledged_by_the_replica(
    redis_sentinel,
):
    store = RedisStore.from_url(redis_sentinel.url, wait_replicas=1)
    _claim_complete_and_drop(store)
    assert store.round_trips == 4  # claim, complete, gate read, ttl: WAIT rides along
    replica = redis_sentinel.nodes[1]
    with replica.client(decode_responses=True) as client:
        assert client.hget("beetle:{orders:m-topology}", "s") == "c"
    store.close()


def test_a_write_no_replica_acknowledged_is_a_store_error(redis_sentinel):
    store = RedisStore(connect(redis_sentinel.url), wait_replicas=1, wait_timeout_ms=200)
    facts = MessageFacts("orders", "m-unacked", expires_at_ms=wall_clock_ms() + 60_000)
    redis_sentinel.nodes[1].pause()  # the replica stops acknowledging
    try:
        with pytest.raises(ReplicaAckTimeout, match="0 of 1 replica") as error:
            store.claim(facts, Limits(), "test:1")
    finally:
        redis_sentinel.nodes[1].resume()
    assert isinstance(error.value, STORE_ERRORS)  # the worker hands back or retries
    store.close()


def test_the_probe_takes_a_store_for_answering_only_once_a_write_gets_its_replica_acks(
    redis_sentinel,
):
    """After a failover the new master takes writes before it has a replica; with
    ``wait_replicas`` the store's writes do not count until one acknowledges, so neither
    does the probe's, and the gate does not resume only to pause again."""
    probe = RedisProbe(redis_sentinel.url, wait_replicas=1)
    plain = RedisProbe(redis_sentinel.url)
    assert wait_until(lambda: probe() and plain(), timeout=20), "the replica is in sync"
    redis_sentinel.nodes[1].pause()  # the replica stops acknowledging
    try:
        assert plain(), "the master still takes a write"
        assert not probe()
        assert "0 of 1 replica(s) acknowledged" in str(probe.last_error)
    finally:
        redis_sentinel.nodes[1].resume()
    assert probe() and probe.last_error is None
    probe.close()
    plain.close()
