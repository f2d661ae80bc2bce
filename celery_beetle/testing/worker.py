"""A Celery worker in a subprocess, as tests and chaos scenarios need it: killable by pid.

The worker runs ``celery -A <app module> worker`` in ``root`` (the current directory unless
given; the project's own tests pass the repository, or a checkout of another commit: a
rolling deploy's older version), with ``root`` first on its PYTHONPATH and the given
environment; tests read what it did from its trace or from files its tasks append to, never
from the code under test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


class WorkerProcess:
    """``celery -A app_module worker`` with its own log file."""

    def __init__(
        self,
        app_module: str,
        log: Path,
        env: dict[str, str],
        *,
        pool: str = "solo",
        concurrency: int = 1,
        queue: str = "celery",
        name: str = "w",
        extra_args: Sequence[str] = (),
        root: Path | None = None,
    ) -> None:
        self.log = log
        self.root = root = Path(root) if root is not None else Path.cwd()
        self.env = {
            **os.environ,
            **env,
            "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        }
        self.args = [
            sys.executable, "-m", "celery", "-A", app_module, "worker",
            "-P", pool, "-c", str(concurrency), "-Q", queue,
            "--without-gossip", "--without-mingle", "-l", "info",
            "-n", f"{name}-{os.getpid()}-{time.monotonic_ns()}@%h", *extra_args,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 45) -> WorkerProcess:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
            )
        deadline = time.monotonic() + ready_timeout
        while b" ready." not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"worker did not start:\n{self.log_text()[-3000:]}")
            time.sleep(0.1)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def log_text(self) -> str:
        return self.log.read_bytes().decode(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20) -> None:
        """Warm shutdown (SIGTERM): running tasks finish and trace buffers are written."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the worker and its pool children (they share its process group)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        children = _children(self.proc.pid)
        self.proc.kill()
        self.proc.wait()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _children(pid: int) -> list[int]:
    try:
        out = subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
        ).stdout
    except FileNotFoundError:
        return []
    return [int(p) for p in out.split()]
