"""The run's outbox relay: ``beetle relay`` as an operator runs it, a subprocess of its own.

It relays the run's database to the run's brokers with the workers' app and environment
(:mod:`.app`: the same ``beetle://`` URL, transport options, trace directory and dedup
scopes), so its ``published`` events land in the run's trace beside the outbox's
``enqueued`` ones. The nemesis kills it with SIGKILL (``relay_kill``), which may fall between
a publish and the row's delete: the next relay publishes the row again and the dedup store
must drop the second copy (docs "The outbox"). It is stopped with SIGTERM once the run has
drained, and killed by pid whatever happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["RelayProcess"]

ROOT = Path(__file__).resolve().parents[3]
APP = "celery_beetle.testing.explorer.app:app"


class RelayProcess:
    """One ``beetle relay`` at a time; :meth:`kill` and :meth:`start` for the nemesis."""

    def __init__(self, db_url: str, env: Callable[[], dict[str, str]], base: Path) -> None:
        #: the run's database, its environment for :mod:`.app`, and its directory (the log)
        self.db_url, self.env, self.base = db_url, env, base
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0

    def start(self) -> None:
        assert self.db_url, "the relay needs the run's database"
        command = [sys.executable, "-c", "from celery_beetle.cli import main; main()",
                   "relay", "--db", self.db_url, "--app", APP]  # fmt: skip
        env = {**os.environ, **self.env()}
        with (self.base / "relay.log").open("ab") as log:
            self.proc = subprocess.Popen(
                command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        self.started += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure(self) -> None:
        """A relay running (after the faults: one killed last is running again)."""
        if not self.alive():
            self.start()

    def kill(self) -> set[int]:
        """SIGKILL, as ``relay_kill`` does; the pids killed."""
        if not self.alive():
            return set()
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait()
        return {pid}

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM (the relay finishes its batch and exits), then SIGKILL after ``timeout``."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill()
