"""A throwaway redis-server for integration and chaos tests.

The dedup store's guarantees are about what survives a Redis crash, so tests need a Redis they may
kill -9, SIGSTOP and restart on the same port and data dir; the machine's own Redis on 6379 is
never touched. With `appendonly=True` every write is fsynced to the AOF before the reply, so a key
a test saw acknowledged is still there after a kill -9 and restart.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_beetle.testing.ports import free_port, log_tail, process_alive, wait_until_gone


def redis_server_binary() -> str | None:
    """Path of redis-server, or None when Redis is not installed."""
    return os.environ.get("BEETLE_REDIS_SERVER") or shutil.which("redis-server")


class RedisServerError(RuntimeError):
    """redis-server failed to start."""


class RedisServer:
    """One redis-server process on 127.0.0.1 with its own port and data dir."""

    host = "127.0.0.1"

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="redis-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        #: more redis-server arguments (e.g. ``--replicaof``), read at every (re)start
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.log_path = self.base_dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    def __repr__(self) -> str:
        state = "paused" if self._paused else "running" if self.is_running else "stopped"
        return f"<RedisServer {self.host}:{self.port} {state}>"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def host_port(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and process_alive(self.pid)

    @property
    def is_paused(self) -> bool:
        return self._paused and self.is_running

    def client(self, **options: Any) -> redis.Redis:
        """A redis-py client that fails fast on a dead or paused server: short timeouts and no
        retries (redis-py retries three times with backoff by default)."""
        options.setdefault("socket_timeout", 5)
        options.setdefault("socket_connect_timeout", 2)
        options.setdefault("retry", Retry(NoBackoff(), 0))
        return redis.Redis(host=self.host, port=self.port, **options)

    def start(self, timeout: float = 20) -> None:
        """Start (again, on the same port and dir) and wait until it answers PING."""
        if self.is_running:
            return
        binary = redis_server_binary()
        if binary is None:
            raise RedisServerError("redis-server is not installed")
        command = [
            binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.base_dir),
            "--logfile", str(self.log_path),
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            *self.extra_args,
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._paused = False
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=1, socket_connect_timeout=0.5)
        while True:
            if self._proc.poll() is not None:
                raise RedisServerError(self._failure(f"exited with {self._proc.returncode}"))
            try:
                if probe.ping():
                    probe.close()
                    return
            except redis.exceptions.BusyLoadingError:
                pass  # replaying the AOF after a restart
            except redis.exceptions.ConnectionError:
                pass
            if time.monotonic() > deadline:
                message = self._failure(f"did not answer PING within {timeout} s")
                self.kill()
                raise RedisServerError(message)
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server and wait until it is gone."""
        if self._proc is None:
            return
        try:
            self._proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()
        wait_until_gone([self._proc.pid], timeout=5)
        self._paused = False

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM (redis writes its AOF/RDB and exits), then kill if it did not."""
        if self._proc is None:
            return
        if self._paused:
            self.resume()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def restart(self, timeout: float = 20) -> None:
        """Start again on the same port and data dir (stopping first if it is running)."""
        if self.is_running:
            self.stop()
        self.start(timeout)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers, like a hung Redis."""
        if not self.is_running or self.pid is None:
            raise RedisServerError(f"{self!r} is not running")
        os.kill(self.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        if self.is_running and self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)
        self._paused = False

    def remove(self) -> None:
        """Stop the server and delete its data dir."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def _failure(self, what: str) -> str:
        return f"redis-server on port {self.port} {what}.\n--- {self.log_path} ---\n" + log_tail(
            self.log_path
        )
