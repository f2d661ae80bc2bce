"""Throwaway RabbitMQ nodes started from the installed binaries, for integration and chaos tests.

Each `RabbitNode` is a real broker with its own node name, ports, mnesia dir, logs and Erlang
cookie under one base dir, so tests can kill -9 it, SIGSTOP it, or restart it on the same ports
and data without touching the machine's own RabbitMQ. Faults act on the beam.smp pid, which is the
process that holds the broker's state and sockets.

The management plugin is enabled on its own port: it costs no measurable startup time (a node
answers AMQP in about 5 s with or without it) and makes vhost setup a millisecond HTTP call.
Queue depths come from `rabbitmqctl` instead, because the management API reports them from
statistics sampled every few seconds, and tests need the numbers as they are now.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika

from celery_beetle.testing.ports import free_port, log_tail, process_alive, wait_until_gone

RABBITMQ_BIN_DIR = Path(os.environ.get("BEETLE_RABBITMQ_BIN_DIR", "/usr/lib/rabbitmq/bin"))

Message = tuple[Any, Any, bytes]
"""What `get_messages` returns per message: pika's (method, properties, body)."""


def rabbitmq_server_binary() -> Path | None:
    """The rabbitmq-server script the nodes run, or None when RabbitMQ is not installed."""
    path = RABBITMQ_BIN_DIR / "rabbitmq-server"
    return path if path.exists() else None


class RabbitNodeError(RuntimeError):
    """A node failed to start, or a rabbitmqctl / management call failed."""


class RabbitNode:
    """One RabbitMQ broker process that a test may start, kill, pause and restart at will."""

    user = "guest"
    password = "guest"
    host = "127.0.0.1"

    def __init__(self, base_dir: Path | str | None = None, *, management: bool = True) -> None:
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="rabbit-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.dist_port = free_port()
        self.management_port: int | None = free_port() if management else None
        self.nodename = f"beetle-test-{self.port}@localhost"
        self.output_log = self.base_dir / "server.out"
        self._proc: subprocess.Popen[bytes] | None = None
        self._beam_pid: int | None = None
        self._paused = False
        self._write_config()

    def __repr__(self) -> str:
        state = "paused" if self._paused else "running" if self.is_running else "stopped"
        return f"<RabbitNode {self.nodename} {self.host_port} {state}>"

    # -- addresses ---------------------------------------------------------------------------

    @property
    def host_port(self) -> str:
        return f"{self.host}:{self.port}"

    def amqp_url(self, vhost: str = "/") -> str:
        return f"amqp://{self.user}:{self.password}@{self.host_port}/{quote(vhost, safe='')}"

    def connection_parameters(self, vhost: str = "/", **options: Any) -> pika.ConnectionParameters:
        """pika parameters for this node; short timeouts by default so a dead node fails fast."""
        options.setdefault("socket_timeout", 2)
        options.setdefault("stack_timeout", 5)
        options.setdefault("blocked_connection_timeout", 5)
        options.setdefault("connection_attempts", 1)
        return pika.ConnectionParameters(
            host=self.host,
            port=self.port,
            virtual_host=vhost,
            credentials=pika.PlainCredentials(self.user, self.password),
            **options,
        )

    def connect(self, vhost: str = "/", **options: Any) -> pika.BlockingConnection:
        """An independent pika connection, so tests see what this broker really holds."""
        return pika.BlockingConnection(self.connection_parameters(vhost, **options))

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The beam.smp pid: the process a fault must hit."""
        return self._beam_pid

    @property
    def is_running(self) -> bool:
        """True while the beam process exists, paused or not."""
        return process_alive(self._beam_pid)

    @property
    def is_paused(self) -> bool:
        return self._paused and self.is_running

    def start(self, timeout: float = 60) -> None:
        """Start (on the same ports and data as before, if it ran) and wait until it answers."""
        if self.is_running:
            return
        binary = RABBITMQ_BIN_DIR / "rabbitmq-server"
        with self.output_log.open("ab") as out:
            out.write(f"\n--- starting {self.nodename} at {time.ctime()} ---\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                [str(binary)],
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # one process group: kill() reaches every helper
            )
        self._paused = False
        self._beam_pid = None
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RabbitNodeError(self._failure(f"exited with {self._proc.returncode}"))
            if self._beam_pid is None:
                self._beam_pid = _find_beam(self._proc.pid)
            if self._beam_pid is not None and self._accepts_amqp() and self._accepts_http():
                return
            if time.monotonic() > deadline:
                message = self._failure(f"did not accept AMQP within {timeout} s")
                self.kill()
                raise RabbitNodeError(message)
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the beam and its helper processes, and wait until they are gone."""
        if self._proc is None:
            return
        group = _process_group(self._proc.pid)
        if self._beam_pid is not None and self._beam_pid not in group:
            group.append(self._beam_pid)
        if self._beam_pid is not None:
            _signal(self._beam_pid, signal.SIGKILL)
            # The wrapper script reaps the beam and exits: no zombie is left behind.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)  # helpers, and the wrapper if it hangs
        self._proc.wait()
        if not wait_until_gone(group, timeout=10):
            raise RabbitNodeError(f"{self.nodename}: processes {group} survived SIGKILL")
        self._paused = False

    def stop(self, timeout: float = 15) -> None:
        """Stop gracefully (SIGTERM lets the broker flush), then kill what is left."""
        if self._proc is None:
            return
        if self._paused:
            self.resume()
        if self._proc.poll() is None:
            _signal(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def restart(self, timeout: float = 60) -> None:
        """Start again on the same ports and mnesia dir: durable queues and persistent messages
        come back, as they would after a broker machine reboots."""
        if self.is_running:
            self.stop()
        self.start(timeout)

    def pause(self) -> None:
        """SIGSTOP the beam: sockets stay open but nothing answers, like a hung broker."""
        if self._beam_pid is None or not self.is_running:
            raise RabbitNodeError(f"{self.nodename} is not running")
        _signal(self._beam_pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        if self._beam_pid is not None:
            _signal(self._beam_pid, signal.SIGCONT)
        self._paused = False

    def remove(self) -> None:
        """Stop the node and delete its base dir (data and logs)."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- administration ----------------------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 30) -> str:
        """Run rabbitmqctl against this node (same HOME, so the same Erlang cookie)."""
        command = [str(RABBITMQ_BIN_DIR / "rabbitmqctl"), "-n", self.nodename, *args]
        result = subprocess.run(
            command, env=self._env(), capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise RabbitNodeError(
                f"rabbitmqctl {' '.join(args)} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        return result.stdout

    def write_definitions_to_disk(self) -> None:
        """Write the node's recent declarations to disk before a kill.

        RabbitMQ 3.x keeps queues, exchanges and bindings in Mnesia, which writes its log
        lazily: a node SIGKILLed within moments of a declaration can come back without it,
        and then without the persistent messages of that queue.
        """
        self.ctl("eval", "mnesia:dump_log().")

    def create_vhost(self, name: str) -> None:
        """Create a vhost and give guest full permissions on it."""
        if self.management_port is None:
            self.ctl("add_vhost", name)
            self.ctl("set_permissions", "-p", name, self.user, ".*", ".*", ".*")
            return
        vhost = quote(name, safe="")
        self._api("PUT", f"/api/vhosts/{vhost}", {})
        permissions = {"configure": ".*", "write": ".*", "read": ".*"}
        self._api("PUT", f"/api/permissions/{vhost}/{self.user}", permissions)

    def vhosts(self) -> list[str]:
        if self.management_port is None:
            return self.ctl("list_vhosts", "--quiet", "--no-table-headers").split()
        return [vhost["name"] for vhost in self._api("GET", "/api/vhosts?columns=name")]

    def delete_vhost(self, name: str) -> None:
        """Delete a vhost and everything in it; a vhost that does not exist is fine."""
        if self.management_port is None:
            try:
                self.ctl("delete_vhost", name)
            except RabbitNodeError as exc:
                if "not exist" not in str(exc).lower():
                    raise
            return
        self._api("DELETE", f"/api/vhosts/{quote(name, safe='')}", missing_ok=True)

    def queue_depths(self, vhost: str = "/") -> dict[str, tuple[int, int]]:
        """{queue: (ready, unacked)} as the broker counts them right now."""
        output = self.ctl(
            "list_queues", "-p", vhost, "--quiet", "--formatter", "json",
            "name", "messages_ready", "messages_unacknowledged",
        )  # fmt: skip
        rows = json.loads(output or "[]")
        return {
            row["name"]: (int(row["messages_ready"]), int(row["messages_unacknowledged"]))
            for row in rows
        }

    def get_messages(self, vhost: str, queue: str, *, ack: bool = True) -> list[Message]:
        """Drain `queue` with basic_get and return pika's (method, properties, body) per message.

        With ack=False nothing is removed: the messages go back to the queue when the connection
        closes, flagged as redelivered.
        """
        messages: list[Message] = []
        connection = self.connect(vhost)
        try:
            channel = connection.channel()
            while True:
                method, properties, body = channel.basic_get(queue, auto_ack=ack)
                if method is None:
                    return messages
                messages.append((method, properties, body))
        finally:
            connection.close()

    # -- internals ---------------------------------------------------------------------------

    def _write_config(self) -> None:
        (self.base_dir / "home").mkdir(exist_ok=True)
        lines = [
            f"listeners.tcp.1 = {self.host}:{self.port}",
            "loopback_users = none",
            # Tests fill queues on small CI disks; a disk alarm would block every publisher.
            "disk_free_limit.absolute = 10MB",
        ]
        plugins = "[]."
        if self.management_port is not None:
            lines += [
                f"management.tcp.ip = {self.host}",
                f"management.tcp.port = {self.management_port}",
                # queue figures in the API every second (5 s by default): a test's
                # `beetle queues migrate --settle-s 1.2` then waits 1.2 s where an operator's
                # waits 5.5 s for the unused temporary queue to show
                "collect_statistics_interval = 1000",
            ]
            plugins = "[rabbitmq_management]."
        (self.base_dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        (self.base_dir / "enabled_plugins").write_text(plugins + "\n")
        # Our own (empty) env file, so /etc/rabbitmq/rabbitmq-env.conf cannot rename the node.
        (self.base_dir / "rabbitmq-env.conf").write_text("")

    def _env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RABBITMQ_", "ERL_")) and k != "NOTIFY_SOCKET"
        }
        env.update(
            HOME=str(self.base_dir / "home"),
            RABBITMQ_CONF_ENV_FILE=str(self.base_dir / "rabbitmq-env.conf"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS=self.host,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.base_dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.base_dir / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base_dir / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(self.base_dir / "rabbitmq.conf"),
            # Erlang schedulers spin while idle by default (+sbwt); several nodes on a small
            # machine would burn the CPU that the clients and the other nodes need
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} "
            "+sbwt none +sbwtdcpu none +sbwtdio none",
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    def _accepts_amqp(self) -> bool:
        try:
            self.connect(socket_timeout=1, stack_timeout=2).close()
        except Exception:
            return False
        return True

    def _accepts_http(self) -> bool:
        if self.management_port is None:
            return True
        try:
            socket.create_connection((self.host, self.management_port), timeout=1).close()
        except OSError:
            return False
        return True

    @property
    def log_path(self) -> Path:
        """The node's own log (connections, channel errors, queue recovery)."""
        return self.base_dir / "log" / f"{self.nodename}.log"

    def log_tail(self) -> str:
        """The end of the node's log, for a failing test's message."""
        return log_tail(self.log_path)

    def _failure(self, what: str) -> str:
        return (
            f"RabbitMQ node {self.nodename} {what}.\n"
            f"--- {self.output_log} ---\n{log_tail(self.output_log)}\n"
            f"--- {self.log_path} ---\n{self.log_tail()}"
        )

    def _api(
        self, method: str, path: str, body: dict[str, Any] | None = None, missing_ok: bool = False
    ) -> Any:
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request = urllib.request.Request(
            f"http://{self.host}:{self.management_port}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            if missing_ok and exc.code == 404:
                return None
            detail = exc.read().decode(errors="replace")
            raise RabbitNodeError(f"{method} {path} on {self.nodename}: {exc.code} {detail}")
        return json.loads(payload) if payload else None


@dataclass
class BrokerSet:
    """What the `brokers` fixture yields: N running nodes sharing one fresh vhost."""

    nodes: list[RabbitNode]
    vhost: str

    @property
    def beetle_url(self) -> str:
        return self.url_for()

    def url_for(self, *indexes: int) -> str:
        """A beetle:// URL over the nodes at `indexes` (all nodes when none are given)."""
        chosen = [self.nodes[i] for i in indexes] if indexes else self.nodes
        return beetle_url([node.host_port for node in chosen], self.vhost)

    def queue_depths(self, *indexes: int) -> list[dict[str, tuple[int, int]]]:
        """Each node's `RabbitNode.queue_depths` in this vhost (the nodes at `indexes`, all
        when none are given), in node order: exact, as each broker counts them now.

        Asked of every node at once: each answer is a `rabbitmqctl` run (an Erlang VM that
        takes about a second to boot), so three nodes answer in about the time of one and a
        half instead of three. A node that cannot answer raises, as it would alone.
        """
        chosen = [self.nodes[i] for i in indexes] if indexes else self.nodes
        with ThreadPoolExecutor(max_workers=len(chosen) or 1) as pool:
            return list(pool.map(lambda node: node.queue_depths(self.vhost), chosen))


def beetle_url(host_ports: list[str], vhost: str) -> str:
    """A beetle:// URL over any addresses, e.g. TcpProxy.host_port in front of some nodes."""
    user, password = RabbitNode.user, RabbitNode.password
    return f"beetle://{user}:{password}@{','.join(host_ports)}/{quote(vhost, safe='')}"


def start_all(nodes: list[RabbitNode], timeout: float = 60) -> None:
    """Start nodes in parallel (each spends most of its ~5 s boot waiting, not computing)."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        futures = [pool.submit(node.start, timeout) for node in nodes]
        errors = [error for future in futures if (error := future.exception()) is not None]
    if errors:
        stop_all(nodes)
        raise errors[0]


def stop_all(nodes: list[RabbitNode]) -> None:
    """Stop nodes in parallel; graceful shutdown takes a second or two each."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        list(pool.map(lambda node: node.stop(), nodes))


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, ..."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _find_beam(wrapper_pid: int) -> int | None:
    """The beam.smp process the rabbitmq-server script started (it forks, then execs erl)."""
    candidates = [wrapper_pid]
    candidates += [
        pid for pid in _all_pids() if (_proc_stat(pid) or ["", ""])[1] == str(wrapper_pid)
    ]
    for pid in candidates:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith("beam"):
                return pid
        except OSError:
            continue
    return None


def _process_group(pgid: int) -> list[int]:
    return [pid for pid in _all_pids() if (_proc_stat(pid) or ["", "", ""])[2] == str(pgid)]
