"""A throwaway PostgreSQL for the outbox's tests.

The outbox's guarantees are about what survives a database crash, so tests need a
PostgreSQL they may kill -9 and restart on the same port and data dir; the machine's own
server on 5432 is never touched. ``initdb`` and ``postgres`` come from
/usr/lib/postgresql/*/bin (or $BEETLE_PG_BIN). PostgreSQL refuses to run as root, so under
root both run as the ``postgres`` user, in a directory it owns.

``fsync`` is off: a kill -9 of the server loses nothing the OS already holds (every commit
still writes its WAL before answering), only a machine crash would.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from celery_beetle.testing.ports import free_port, log_tail, process_alive, wait_until_gone

__all__ = ["PostgresServer", "PostgresServerError", "postgres_bin_dir"]


def postgres_bin_dir() -> Path | None:
    """The directory holding initdb and postgres, or None when PostgreSQL is not installed."""
    given = os.environ.get("BEETLE_PG_BIN")
    candidates = [given] if given else sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for directory in candidates:
        if directory and (Path(directory) / "initdb").exists():
            return Path(directory)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class PostgresServerError(RuntimeError):
    """initdb or postgres failed."""


class PostgresServer:
    """One postgres on 127.0.0.1 with its own port, data dir and socket dir."""

    host = "127.0.0.1"
    user = "beetle"

    def __init__(self, base_dir: Path | str | None = None) -> None:
        self._run_as = _unprivileged_user()
        if base_dir is not None and self._run_as is not None:
            # the postgres user must reach its directory: a base under root's own private
            # dirs (pytest's tmp_path is 0700) is out of its reach, so it lives in the
            # system's temp dir instead
            base_dir = None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="beetle-pg-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "postgres.log"
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        if self._run_as is not None:
            os.chown(self.base_dir, self._run_as.pw_uid, self._run_as.pw_gid)

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<PostgresServer {self.host}:{self.port} {state}>"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and process_alive(self.pid)

    def _run(self, command: list[str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            command, capture_output=True, user=self._user_arg(), cwd=self.base_dir, check=False
        )

    def _user_arg(self) -> str | None:
        return self._run_as.pw_name if self._run_as is not None else None

    def start(self, timeout: float = 30) -> PostgresServer:
        """initdb on first start; start (again, same port and dir); wait until it answers."""
        if self.is_running:
            return self
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise PostgresServerError("PostgreSQL is not installed (no initdb found)")
        if not (self.data_dir / "PG_VERSION").exists():
            done = self._run([str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.user,
                              "--auth=trust", "-E", "UTF8", "--no-sync"])  # fmt: skip
            if done.returncode:
                raise PostgresServerError(f"initdb failed: {done.stderr.decode(errors='replace')}")
        command = [
            str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
            "-k", str(self.base_dir), "-c", f"listen_addresses={self.host}",
            "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=100",
            "-c", "shared_buffers=32MB",
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child keeps it)
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: kill() takes the backends with it
            user=self._user_arg(),
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self._proc.poll() is not None:
                raise PostgresServerError(self._failure(f"exited with {self._proc.returncode}"))
            if time.monotonic() > deadline:
                message = self._failure(f"did not answer within {timeout} s")
                self.kill()
                raise PostgresServerError(message)
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(
                host=self.host, port=self.port, user=self.user, dbname="postgres", connect_timeout=1
            ) as conn:
                conn.execute("select 1")
            return True
        except psycopg.OperationalError:
            return False

    def create_database(self, name: str) -> str:
        """A fresh database; returns its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (its process group), as a crash would."""
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()
        wait_until_gone([self._proc.pid], timeout=5)

    def stop(self, timeout: float = 10) -> None:
        """Fast shutdown (SIGINT), then kill if it did not stop."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def restart(self, timeout: float = 30) -> None:
        if self.is_running:
            self.stop()
        self.start(timeout)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def _failure(self, what: str) -> str:
        return f"postgres on port {self.port} {what}.\n--- {self.log_path} ---\n" + log_tail(
            self.log_path
        )


def _unprivileged_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresServerError("running as root needs a 'postgres' user to run PostgreSQL")
