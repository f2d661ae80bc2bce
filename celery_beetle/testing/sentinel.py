"""A Redis master, one replica and one Sentinel, for failover tests of the dedup store.

A Sentinel failover is the outage a production store sees most: the master dies, the
Sentinel promotes the replica, clients find the new master by asking the Sentinel again.
Replication is asynchronous, so what the old master acknowledged last may be missing on the
new one; the tests need a real trio they can kill -9 by pid to see whether that matters.

Everything runs from the installed redis-server on free ports of 127.0.0.1 (the machine's own
Redis on 6379 is never touched) and is killed by pid in :meth:`SentinelSet.stop`. The data
nodes keep nothing on disk: a node that comes back is empty until it has synced from the
master, which is how a replica rejoins anyway.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from celery_beetle.testing.ports import free_port, log_tail, process_alive, wait_until_gone
from celery_beetle.testing.redis_server import RedisServer, RedisServerError, redis_server_binary

#: a replica's full sync starts at once (Redis waits 5 s for more replicas by default)
_NODE_ARGS = ["--repl-diskless-sync-delay", "0"]


class SentinelProcess:
    """``redis-server sentinel.conf --sentinel``: one Sentinel watching one master."""

    host = "127.0.0.1"

    def __init__(
        self,
        base_dir: Path,
        service: str,
        master: RedisServer,
        *,
        down_after_ms: int,
        failover_timeout_ms: int,
    ) -> None:
        self.base_dir = base_dir
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.conf_path = base_dir / "sentinel.conf"  # a Sentinel rewrites its own config
        self.log_path = base_dir / "sentinel.log"
        self.conf_path.write_text(
            f"port {self.port}\n"
            f"bind {self.host}\n"
            f"dir {base_dir}\n"
            f"logfile {self.log_path}\n"
            f"sentinel monitor {service} {master.host} {master.port} 1\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def client(self) -> redis.Redis:
        return redis.Redis(
            host=self.host, port=self.port, socket_timeout=1, socket_connect_timeout=1
        )

    def start(self) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RedisServerError("redis-server is not installed")
        self._proc = subprocess.Popen(
            [binary, str(self.conf_path), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL by pid and wait until it is gone."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.kill()
        self._proc.wait()
        wait_until_gone([self._proc.pid], timeout=5)

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and process_alive(self.pid)


class SentinelSet:
    """A master, its replica and a Sentinel (quorum 1) that fails over within seconds.

    ``url`` is the store URL workers use; :meth:`kill_master`, :meth:`wait_failover` and
    :meth:`rejoin` are the failover, step by step, so a test can act between the steps.

    ``down_after_ms`` stays above the Sentinel's one-second ping period: at 1000 ms it
    sometimes found the master it had just promoted "down" before its first ping, failed over
    back, and left the new master without a replica for the ten seconds it takes to demote
    the other node.
    """

    service = "beetle"

    def __init__(
        self, base_dir: Path, *, down_after_ms: int = 2000, failover_timeout_ms: int = 3000
    ) -> None:
        self.base_dir = base_dir
        self.nodes = [RedisServer(base_dir / f"node{i}", extra_args=_NODE_ARGS) for i in (0, 1)]
        self.sentinel = SentinelProcess(
            base_dir / "sentinel",
            self.service,
            self.nodes[0],
            down_after_ms=down_after_ms,
            failover_timeout_ms=failover_timeout_ms,
        )

    def __repr__(self) -> str:
        return f"<SentinelSet sentinel={self.sentinel.port} nodes={self.nodes!r}>"

    @property
    def url(self) -> str:
        return f"redis+sentinel://{self.sentinel.host}:{self.sentinel.port}/{self.service}/0"

    def start(self, timeout: float = 20) -> None:
        """Master, then a replica in sync with it, then a Sentinel that knows both."""
        master, replica = self.nodes
        master.start()
        replica.extra_args = [*_NODE_ARGS, "--replicaof", master.host, str(master.port)]
        replica.start()
        self.wait_for(lambda: replica_in_sync(replica), "the replica to sync", timeout)
        # "in sync" is the replica's view; a store that waits for replicas needs the master's
        self.wait_for(lambda: replica_acknowledges(master), "the replica to acknowledge", timeout)
        self.sentinel.start()
        self.wait_for(self._sentinel_sees_replica, "the sentinel to find the replica", timeout)

    def master(self) -> RedisServer:
        """The node the Sentinel names as master now."""
        with self.sentinel.client() as probe:
            _, port = probe.sentinel_get_master_addr_by_name(self.service)
        return next(node for node in self.nodes if node.port == int(port))

    def kill_master(self, *, unreplicated_s: float = 0.0) -> RedisServer:
        """kill -9 the current master; returns it.

        With ``unreplicated_s`` the replica is first cut off for that long while the master
        keeps acknowledging writes, so the replica the Sentinel promotes lacks them: the
        asynchronous replication lag a kill -9 on one host hardly ever shows (the kernel
        hands the replica every byte the master wrote, even to a stopped process).
        """
        node = self.master()
        replica = next(other for other in self.nodes if other is not node)
        if unreplicated_s:
            with replica.client() as client:
                # a password the master does not have: the replica cannot sync again
                client.config_set("masterauth", "not-the-masters-password")
                client.client_kill_filter(_type="master")
            self.wait_for(lambda: not replica_in_sync(replica), "the replica to lose its link", 5)
            time.sleep(unreplicated_s)
        node.kill()
        if unreplicated_s:
            with replica.client() as client:
                client.config_set("masterauth", "")
        return node

    def wait_failover(self, old: RedisServer, timeout: float = 30) -> RedisServer:
        """Wait until the Sentinel names another node and that node says it is master."""

        def promoted() -> bool:
            new = self.master()
            return new is not old and _role(new) == "master"

        self.wait_for(promoted, "the sentinel to promote the replica", timeout)
        return self.master()

    def rejoin(self, node: RedisServer, timeout: float = 20) -> None:
        """Start a dead node again as a replica of the current master, and wait until it
        is in sync (what the Sentinel would otherwise reconfigure it to, seconds later)."""
        master = self.master()
        node.extra_args = [*_NODE_ARGS, "--replicaof", master.host, str(master.port)]
        node.start()
        self.wait_for(lambda: replica_in_sync(node), "the old master to sync as a replica", timeout)
        self.wait_for(lambda: replica_acknowledges(master), "the replica to acknowledge", timeout)

    def replica(self) -> RedisServer:
        """The node that is not the master now."""
        master = self.master()
        return next(node for node in self.nodes if node is not master)

    def heal(self, timeout: float = 30) -> None:
        """Both nodes up, unfrozen and taking writes, the replica in sync with the master:
        what a fault left (a node that is down rejoins as a replica)."""
        for node in self.nodes:
            if node.is_paused:
                node.resume()
        for node in self.nodes:
            if not node.is_running:
                self.rejoin(node, timeout)
        for node in self.nodes:
            with node.client() as client:
                client.config_set("maxmemory", 0)
        self.wait_for(lambda: replica_in_sync(self.replica()), "the replica to sync", timeout)
        master = self.master()
        self.wait_for(lambda: replica_acknowledges(master), "the replica to acknowledge", timeout)

    def stop(self) -> None:
        """Kill the Sentinel and both nodes by pid."""
        self.sentinel.kill()
        for node in self.nodes:
            node.kill()

    def _sentinel_sees_replica(self) -> bool:
        with self.sentinel.client() as probe:
            replicas = probe.sentinel_slaves(self.service)
        return any(int(r["port"]) == self.nodes[1].port for r in replicas)

    def wait_for(self, check: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except (redis.exceptions.RedisError, OSError, StopIteration):
                pass
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"timed out after {timeout} s waiting for {what}.\n"
                    f"--- {self.sentinel.log_path} ---\n{log_tail(self.sentinel.log_path)}"
                )
            time.sleep(0.05)


def _info(node: RedisServer) -> dict[str, Any]:
    with node.client(socket_timeout=1, socket_connect_timeout=0.5) as client:
        info: dict[str, Any] = client.info("replication")
        return info


def _role(node: RedisServer) -> str:
    return str(_info(node)["role"])


def replica_in_sync(node: RedisServer) -> bool:
    info = _info(node)
    return info["role"] == "slave" and info.get("master_link_status") == "up"


def replica_acknowledges(master: RedisServer) -> bool:
    """A write on ``master`` is acknowledged by a replica within 200 ms (``WAIT 1``): a
    replica that has just synced takes up to a second to send its first acknowledgement."""
    with master.client(socket_timeout=1, socket_connect_timeout=0.5) as client:
        pipe = client.pipeline(transaction=False)
        pipe.set("beetle-test:replica-ack", 1, px=1000)
        pipe.execute_command("WAIT", 1, 200)
        return int(pipe.execute()[1]) >= 1
