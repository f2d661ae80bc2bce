"""RabbitMQ nodes and Redis servers in Docker containers, for machines with a Docker engine.

The same faults as the local harness, mapped onto the engine: kill is `docker kill` (SIGKILL to
the container's init, which takes every process in it down), pause and resume are `docker pause`
and `unpause` (the cgroup freezer: sockets stay open and nothing answers, as under SIGSTOP), and
restart starts the same container again, so its data (writable layer and volumes) and its host
ports come back. Host ports are picked up front with `free_port` and published on 127.0.0.1
only, so a node keeps its address across restarts, as a broker machine that reboots would.

Images: `BEETLE_TEST_RABBITMQ_IMAGE` (default `rabbitmq:3.13-management`) and
`BEETLE_TEST_REDIS_IMAGE` (default `redis:7`). The containers run `rabbitmq-server` and
`redis-server ARGS`, which the official images' entrypoints accept as they are and which
`scripts/build-test-images` (a Debian image for engines that cannot pull) has on its PATH.
Settings go in as files copied into the container before it starts. Ports are published on
the engine's 127.0.0.1, so the engine must run on this machine (or forward its loopback, as
Docker Desktop does); a remote DOCKER_HOST is not supported.

The classes subclass `RabbitNode` and `RedisServer`: addresses, clients, the management API,
`queue_depths` and `get_messages` are inherited and talk to the published ports; only what
touches a process is replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import docker
import docker.errors
import redis
from docker.models.containers import Container
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer

from celery_beetle.testing.ports import free_port
from celery_beetle.testing.rabbit import RabbitNode, RabbitNodeError
from celery_beetle.testing.redis_server import RedisServer, RedisServerError

RABBITMQ_IMAGE = os.environ.get("BEETLE_TEST_RABBITMQ_IMAGE", "rabbitmq:3.13-management")
REDIS_IMAGE = os.environ.get("BEETLE_TEST_REDIS_IMAGE", "redis:7")
#: every container the harness starts carries it: `docker rm -f $(docker ps -aq -f label=...)`
LABEL = "beetle-test"

# RabbitMQ settings for both images (each reads /etc/rabbitmq/conf.d/*.conf after its defaults):
# guest may log in through the published port, and a small CI disk raises no disk alarm.
_RABBITMQ_CONF = b"loopback_users = none\ndisk_free_limit.absolute = 10MB\n"
# Erlang schedulers spin while idle by default; three nodes would burn two cores doing nothing.
_RABBITMQ_ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"
_AMQP_PORT, _MANAGEMENT_PORT, _REDIS_PORT = 5672, 15672, 6379


def docker_engine(timeout: float = 1.0) -> docker.DockerClient | None:
    """A client of the engine that DOCKER_HOST (or the default socket) names, if it answers
    a ping within `timeout` seconds; None otherwise, which means: use the local binaries."""
    try:
        client = docker.from_env(timeout=max(1, round(timeout)))
        client.ping()
    except Exception:  # no socket, refused, timed out, bad DOCKER_HOST: all mean "no engine"
        return None
    return client


def missing_images(client: docker.DockerClient) -> list[str]:
    """The images the harness needs that are neither present nor pullable (pulls what it can)."""
    missing = []
    for image in dict.fromkeys([RABBITMQ_IMAGE, REDIS_IMAGE]):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            try:
                client.images.pull(image)
            except docker.errors.APIError:
                missing.append(image)
    return missing


def prepare_engine(client: docker.DockerClient) -> str:
    """Turn off testcontainers' reaper (Ryuk) when its image is neither present nor pullable;
    returns a note for the session header when it did.

    Ryuk only removes containers that a crashed session leaves behind; the fixtures remove
    theirs at session end, and every container carries LABEL for a manual clean-up.
    """
    if testcontainers_config.ryuk_disabled:
        return ""
    image = testcontainers_config.ryuk_image
    try:
        client.images.get(image)
        return ""
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.pull(image)
    except docker.errors.APIError:
        testcontainers_config.ryuk_disabled = True
        return f"without testcontainers' reaper: {image} cannot be pulled"
    return ""


class _Managed:
    """One container created at the first start and reused by every later start."""

    def __init__(self, image: str, command: list[str], env: dict[str, str]) -> None:
        self.image = image
        self.command = command
        self.env = env
        self.published: dict[int, int] = {}  # container port -> host port on 127.0.0.1
        self.files: dict[str, bytes] = {}  # path in the container -> content
        self._tc: DockerContainer | None = None

    @property
    def container(self) -> Container | None:
        return self._tc.get_wrapped_container() if self._tc is not None else None

    def start(self) -> None:
        """Create and start the container, or start the existing one again (same data, ports)."""
        if self._tc is None:
            tc = DockerContainer(self.image, command=cast(Any, self.command), env=self.env)
            ports = cast(dict[str, Any], tc.ports)  # the SDK also takes (address, port) pairs
            for inside, outside in self.published.items():
                ports[f"{inside}/tcp"] = ("127.0.0.1", outside)
            for path, content in self.files.items():
                tc.with_copy_into_container(content, path)
            tc.with_kwargs(labels={LABEL: "1"})
            self._tc = tc.start()
        else:
            container = self.container
            assert container is not None
            container.start()

    def state(self) -> dict[str, Any]:
        """`State` of docker inspect, fresh from the engine; empty before the first start."""
        container = self.container
        if container is None:
            return {}
        try:
            container.reload()
        except docker.errors.NotFound:
            return {}
        return cast(dict[str, Any], container.attrs["State"])

    @property
    def status(self) -> str:
        """created, running, paused, exited, ... or "" when there is no container."""
        return str(self.state().get("Status", ""))

    @property
    def pid(self) -> int | None:
        """The host pid of the container's init process; None while it does not run."""
        return int(self.state().get("Pid") or 0) or None

    def kill(self, timeout: float = 10) -> None:
        """SIGKILL (a paused container too: the freezer lets it die) and wait until it exited."""
        container = self.container
        if container is None or self.status not in ("running", "paused"):
            return
        with contextlib.suppress(docker.errors.APIError):  # it may have just exited
            container.kill("SIGKILL")
        if self.status == "paused":
            with contextlib.suppress(docker.errors.APIError):
                container.unpause()
        deadline = time.monotonic() + timeout
        while self.status in ("running", "paused"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"container {container.short_id} survived SIGKILL")
            time.sleep(0.05)

    def stop(self, timeout: float) -> None:
        """SIGTERM, SIGKILL after `timeout` seconds (docker stop)."""
        container = self.container
        if container is None:
            return
        if self.status == "paused":
            container.unpause()
        if self.status == "running":
            container.stop(timeout=max(1, round(timeout)))

    def pause(self) -> None:
        container = self.container
        assert container is not None
        container.pause()

    def resume(self) -> None:
        container = self.container
        if container is not None and self.status == "paused":
            container.unpause()

    def remove(self) -> None:
        """Delete the container and its anonymous volumes (the official images declare some)."""
        if self._tc is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self._tc.stop(force=True, delete_volume=True)
            self._tc = None

    def logs(self, lines: int = 40) -> str:
        container = self.container
        if container is None:
            return "(no container)"
        try:
            return cast(bytes, container.logs(tail=lines)).decode(errors="replace")
        except docker.errors.APIError as exc:
            return f"(no logs: {exc})"

    def exec(self, command: list[str]) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of a command run in the container."""
        container = self.container
        if container is None:
            return 1, "", "the container was never started"
        code, (out, err) = container.exec_run(command, demux=True)
        return int(code), (out or b"").decode(errors="replace"), (err or b"").decode("replace")


class RabbitContainer(RabbitNode):
    """A RabbitMQ broker in a container, with RabbitNode's interface (same faults, same calls).

    `pid` is the container's init (the rabbitmq-server script or beam itself); a kill takes
    the whole container down, so beam goes with it. `nodename` is rabbit@<container hostname>,
    as the images name it; rabbitmqctl runs inside the container.
    """

    def __init__(
        self, base_dir: Path | str | None = None, *, management: bool = True, image: str = ""
    ) -> None:
        # RabbitNode.__init__ writes a config for a local process; nothing of it applies here.
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="rabbit-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.management_port = free_port() if management else None
        self.output_log = self.base_dir / "server.out"
        self._paused = False
        self._box = _Managed(
            image or RABBITMQ_IMAGE,
            ["rabbitmq-server"],
            {"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": _RABBITMQ_ERL_ARGS},
        )
        self._box.published[_AMQP_PORT] = self.port
        self._box.files["/etc/rabbitmq/conf.d/90-beetle-test.conf"] = _RABBITMQ_CONF
        plugins = b"[rabbitmq_management].\n" if management else b"[].\n"
        self._box.files["/etc/rabbitmq/enabled_plugins"] = plugins
        if self.management_port is not None:
            self._box.published[_MANAGEMENT_PORT] = self.management_port

    @property
    def nodename(self) -> str:  # type: ignore[override]  # an attribute on RabbitNode
        container = self._box.container
        return f"rabbit@{container.attrs['Config']['Hostname']}" if container else "(not created)"

    def __repr__(self) -> str:
        return f"<RabbitContainer {self._box.image} {self.host_port} {self._box.status or 'new'}>"

    @property
    def pid(self) -> int | None:
        return self._box.pid

    @property
    def is_running(self) -> bool:
        """True while the container runs, paused or not (a paused one is hung, not dead)."""
        return self._box.status in ("running", "paused")

    @property
    def is_paused(self) -> bool:
        return self._box.status == "paused"

    def start(self, timeout: float = 90) -> None:
        """Start (the same container again, if it ran) and wait until AMQP and HTTP answer."""
        if self.is_running:
            return
        self._box.start()
        self._paused = False
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_running:
                raise RabbitNodeError(self._failure("exited while starting"))
            if self._accepts_amqp() and self._accepts_http() and self._management_answers():
                return
            if time.monotonic() > deadline:
                message = self._failure(f"did not accept AMQP within {timeout} s")
                self.kill()
                raise RabbitNodeError(message)
            time.sleep(0.2)

    def kill(self) -> None:
        """docker kill: SIGKILL for every process in the container; waits until it exited."""
        self._box.kill()
        self._paused = False

    def stop(self, timeout: float = 15) -> None:
        """docker stop: SIGTERM lets the broker flush, SIGKILL after `timeout` seconds."""
        self._box.stop(timeout)
        self._paused = False

    def restart(self, timeout: float = 90) -> None:
        """Start the same container again: same host ports and data, so durable queues and
        persistent messages come back, as after a broker machine reboots."""
        if self.is_running:
            self.stop()
        self.start(timeout)

    def pause(self) -> None:
        """docker pause (cgroup freezer): sockets stay open but nothing answers."""
        if self._box.status != "running":
            raise RabbitNodeError(f"{self!r} is not running")
        self._box.pause()
        self._paused = True

    def resume(self) -> None:
        self._box.resume()
        self._paused = False

    def remove(self) -> None:
        """Delete the container with its data (a kill: the data goes anyway) and the base dir."""
        self._box.remove()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def ctl(self, *args: str, timeout: float = 30) -> str:
        """rabbitmqctl inside the container (its cookie, its node name)."""
        code, out, err = self._box.exec(["rabbitmqctl", *args])
        if code != 0:
            raise RabbitNodeError(
                f"rabbitmqctl {' '.join(args)} failed ({code}): {err.strip() or out.strip()}"
            )
        return out

    def _management_answers(self) -> bool:
        """The management listener accepts (through the proxy) before its API serves."""
        if self.management_port is None:
            return True
        try:
            self._api("GET", "/api/overview?columns=rabbitmq_version")
        except (RabbitNodeError, OSError, json.JSONDecodeError):
            return False
        return True

    def _failure(self, what: str) -> str:
        return f"RabbitMQ container {self!r} {what}.\n--- docker logs ---\n{self._box.logs()}"


class RedisContainer(RedisServer):
    """A redis-server in a container, with RedisServer's interface (same faults, same calls).

    `extra_args` are fixed when the container is created (its first start): a container cannot
    change its command, so changing them afterwards is refused rather than silently ignored.
    """

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        image: str = "",
    ) -> None:
        super().__init__(base_dir, appendonly=appendonly, extra_args=extra_args)
        self._image = image or REDIS_IMAGE
        self._box: _Managed | None = None
        self._created_with: list[str] = []

    def __repr__(self) -> str:
        status = self._box.status if self._box else "new"
        return f"<RedisContainer {self._image} {self.host_port} {status}>"

    @property
    def pid(self) -> int | None:
        return self._box.pid if self._box else None

    @property
    def is_running(self) -> bool:
        return self._box is not None and self._box.status in ("running", "paused")

    @property
    def is_paused(self) -> bool:
        return self._box is not None and self._box.status == "paused"

    def start(self, timeout: float = 30) -> None:
        """Start (the same container again, if it ran) and wait until it answers PING."""
        if self.is_running:
            return
        if self._box is None:
            self._box = self._create()
        elif self.extra_args != self._created_with:
            raise RedisServerError(
                f"{self!r}: extra_args changed after the container was created; "
                "a container keeps the command it was created with"
            )
        self._box.start()
        self._paused = False
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=1, socket_connect_timeout=0.5)
        try:
            while True:
                if not self.is_running:
                    raise RedisServerError(self._failure("exited while starting"))
                try:
                    if probe.ping():
                        return
                except (redis.exceptions.BusyLoadingError, redis.exceptions.ConnectionError):
                    pass  # not listening yet (the proxy accepts, then drops), or replaying AOF
                if time.monotonic() > deadline:
                    message = self._failure(f"did not answer PING within {timeout} s")
                    self.kill()
                    raise RedisServerError(message)
                time.sleep(0.05)
        finally:
            probe.close()

    def kill(self) -> None:
        """docker kill: SIGKILL; waits until the container exited."""
        if self._box is not None:
            self._box.kill()
        self._paused = False

    def stop(self, timeout: float = 10) -> None:
        """docker stop: SIGTERM (redis writes its AOF and exits), SIGKILL after `timeout`."""
        if self._box is not None:
            self._box.stop(timeout)
        self._paused = False

    def restart(self, timeout: float = 30) -> None:
        """Start the same container again: same host port, same /data (AOF)."""
        if self.is_running:
            self.stop()
        self.start(timeout)

    def pause(self) -> None:
        """docker pause (cgroup freezer): connections stay open but nothing answers."""
        if self._box is None or self._box.status != "running":
            raise RedisServerError(f"{self!r} is not running")
        self._box.pause()
        self._paused = True

    def resume(self) -> None:
        if self._box is not None:
            self._box.resume()
        self._paused = False

    def remove(self) -> None:
        """Delete the container with its data (a kill: the data goes anyway) and the base dir."""
        if self._box is not None:
            self._box.remove()
            self._box = None
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def _create(self) -> _Managed:
        self._created_with = list(self.extra_args)
        command = [
            "redis-server",
            "--port", str(_REDIS_PORT),
            "--bind", "0.0.0.0",
            "--protected-mode", "no",  # clients come through the engine's proxy, not loopback
            "--dir", "/data",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            *self.extra_args,
        ]  # fmt: skip
        box = _Managed(self._image, command, {})
        box.published[_REDIS_PORT] = self.port
        return box

    def _failure(self, what: str) -> str:
        logs = self._box.logs() if self._box else "(no container)"
        return f"Redis container {self!r} {what}.\n--- docker logs ---\n{logs}"
