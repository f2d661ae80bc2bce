"""pytest-celery's model (a setup of a broker cluster, a backend and workers), carrying
beetle's servers: RabbitMQ nodes behind one ``beetle://`` URL, the dedup Redis, and workers
of the user's own app, each with the faults a test injects.

Why subclasses that replace most methods: pytest-celery's nodes wrap a
``pytest_docker_tools`` container (``CeleryTestNode.container``), and every method of theirs
(``ready``, ``config``, ``logs``, ``kill``, ``restart``, ``hostname``) talks to the Docker
engine through it; its workers are images built per test session. Here the servers are
local processes (the backend that must work without an engine) or the harness's
testcontainers nodes (:mod:`.containers`), both behind :class:`~.rabbit.RabbitNode` /
:class:`~.redis_server.RedisServer`'s interface, and a worker is a ``celery worker``
subprocess. So each class keeps pytest-celery's type and names, so a test or helper written
for ``celery_setup`` reads the same (``setup.broker_cluster[1].kill()``,
``setup.worker.logs()``), and carries its server in ``server`` instead of ``container``,
which is ``None``.
"""

from __future__ import annotations

import contextlib
import json
import signal as signals
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import celery
from celery import Celery
from pytest_celery import (
    CeleryBackendCluster,
    CeleryBrokerCluster,
    CeleryTestBackend,
    CeleryTestBroker,
    CeleryTestSetup,
    CeleryTestWorker,
    CeleryWorkerCluster,
)

from celery_beetle.audit.naive import Verdict
from celery_beetle.testing import verdict as verdicts
from celery_beetle.testing.ports import log_tail
from celery_beetle.testing.rabbit import RabbitNode, beetle_url
from celery_beetle.testing.redis_faults import refusing_writes
from celery_beetle.testing.redis_server import RedisServer
from celery_beetle.testing.waiting import wait_until
from celery_beetle.testing.worker import WorkerProcess

__all__ = [
    "BeetleBroker",
    "BeetleBrokerCluster",
    "BeetleStore",
    "BeetleStoreCluster",
    "BeetleTestSetup",
    "BeetleWorker",
    "BeetleWorkerCluster",
]

_NO_CONTAINER: Any = None
_SIGNALS = {"SIGKILL": signals.SIGKILL, "SIGTERM": signals.SIGTERM, "SIGSTOP": signals.SIGSTOP}


def _signum(signal: str | int) -> int:
    return _SIGNALS[signal] if isinstance(signal, str) else int(signal)


class BeetleBroker(CeleryTestBroker):
    """One RabbitMQ node of the cluster, in the test's own vhost.

    Faults: :meth:`kill` (kill -9; ``docker kill`` for a container), :meth:`freeze`
    (SIGSTOP / ``docker pause``: sockets stay open, nothing answers), :meth:`thaw`,
    :meth:`restart` (same ports and data: durable queues and persistent messages come back).
    """

    def __init__(self, server: RabbitNode, vhost: str, app: Celery | None = None) -> None:
        super().__init__(_NO_CONTAINER, app)
        self.server = server
        self.vhost = vhost

    def __repr__(self) -> str:
        return f"<BeetleBroker {self.server!r} vhost={self.vhost}>"

    def ready(self) -> bool:
        return self.server.is_running and not self.server.is_paused

    def config(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        url = self.server.amqp_url(self.vhost)
        return {"url": url, "host_url": url, "vhost": self.vhost}

    def logs(self) -> str:
        return log_tail(self.server.output_log, 200)

    def name(self) -> str:
        return str(self.server.nodename)

    def hostname(self) -> str:
        return self.server.host_port

    def kill(self, signal: str | int = "SIGKILL", reload_container: bool = True) -> None:
        """kill -9 by default; ``SIGTERM`` stops gracefully, ``SIGSTOP`` freezes."""
        signum = _signum(signal)
        if signum == signals.SIGSTOP:
            self.freeze()
        elif signum == signals.SIGTERM:
            self.server.stop()
        else:
            self.server.kill()

    def freeze(self) -> None:
        """SIGSTOP (``docker pause``): sockets stay open, nothing answers until :meth:`thaw`."""
        self.server.pause()

    def thaw(self) -> None:
        """Lets a frozen node answer again."""
        self.server.resume()

    def restart(self, reload_container: bool = True, force: bool = False) -> None:
        """Start again (stopping first if it runs; ``force``: kill -9 instead of a stop)."""
        if self.server.is_paused:
            self.server.resume()
        if force:
            self.server.kill()
        self.server.restart()

    def queue_depths(self) -> dict[str, tuple[int, int]]:
        """``{queue: (ready, unacked)}`` in this test's vhost, as the broker counts them now."""
        return self.server.queue_depths(self.vhost)

    def teardown(self) -> None:
        """Nothing: nodes live for the session; the fixture drops the test's vhost."""


class BeetleBrokerCluster(CeleryBrokerCluster):
    """N RabbitMQ nodes behind one ``beetle://`` URL (:attr:`beetle_url`)."""

    def __init__(self, *nodes: BeetleBroker) -> None:
        super().__init__(*nodes)

    def __getitem__(self, index: int) -> BeetleBroker:
        return cast(BeetleBroker, super().__getitem__(index))

    @property
    def brokers(self) -> list[BeetleBroker]:
        return [cast(BeetleBroker, node) for node in self.nodes]

    @property
    def vhost(self) -> str:
        return self.brokers[0].vhost

    @property
    def beetle_url(self) -> str:
        """A ``beetle://`` URL over every node."""
        return self.url_for()

    def url_for(self, *indexes: int) -> str:
        """A ``beetle://`` URL over the nodes at ``indexes`` (all when none are given)."""
        chosen = [self.brokers[i] for i in indexes] if indexes else self.brokers
        return beetle_url([b.server.host_port for b in chosen], self.vhost)

    def config(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**super().config(), "beetle_url": self.beetle_url}


class BeetleStore(CeleryTestBackend):
    """The dedup store: one Redis (the setup's "backend" in pytest-celery's model; the app's
    result backend is separate, and a BeetleTask needs none).

    Faults: :meth:`refusing_writes` (a context: every write fails with OOM, reads answer),
    :meth:`kill`, :meth:`freeze` / :meth:`thaw`, :meth:`restart`.
    """

    def __init__(self, server: RedisServer, app: Celery | None = None) -> None:
        super().__init__(_NO_CONTAINER, app)
        self.server = server

    def __repr__(self) -> str:
        return f"<BeetleStore {self.server!r}>"

    @property
    def url(self) -> str:
        return self.server.url

    def ready(self) -> bool:
        return self.server.is_running and not self.server.is_paused

    def config(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"url": self.server.url, "host_url": self.server.url}

    def logs(self) -> str:
        return log_tail(self.server.log_path, 200)

    def name(self) -> str:
        return repr(self.server)

    def hostname(self) -> str:
        return self.server.host_port

    def kill(self, signal: str | int = "SIGKILL", reload_container: bool = True) -> None:
        """Kills the Redis server (kill -9 by default; SIGSTOP freezes it, SIGTERM stops it)."""
        signum = _signum(signal)
        if signum == signals.SIGSTOP:
            self.freeze()
        elif signum == signals.SIGTERM:
            self.server.stop()
        else:
            self.server.kill()

    def freeze(self) -> None:
        """Freezes the Redis server: connections stay open, nothing answers until :meth:`thaw`."""
        self.server.pause()

    def thaw(self) -> None:
        """Lets a frozen Redis server answer again."""
        self.server.resume()

    def restart(self, reload_container: bool = True, force: bool = False) -> None:
        """Starts the Redis server again on the same port and data (killed first with
        ``force``)."""
        if self.server.is_paused:
            self.server.resume()
        if force:
            self.server.kill()
        self.server.restart()

    @contextlib.contextmanager
    def refusing_writes(self) -> Iterator[None]:
        """Every write fails with ``OOM command not allowed`` inside; reads still answer."""
        with refusing_writes(self.server):
            yield

    def teardown(self) -> None:
        """Nothing: the server lives for the session; the fixture empties it per test."""


class BeetleStoreCluster(CeleryBackendCluster):
    """The setup's backend cluster: the one dedup store."""

    def __init__(self, *nodes: BeetleStore) -> None:
        super().__init__(*nodes)


class BeetleWorker(CeleryTestWorker):
    """A ``celery worker`` subprocess of the user's app, with ``celery_beetle.install``.

    Faults: :meth:`kill` (kill -9 of the worker and its pool), :meth:`kill_mid_task` (once
    a task has started in it and not finished), :meth:`restart`.
    """

    def __init__(
        self, process: WorkerProcess, app: Celery, trace_dir: Path, queue: str = "celery"
    ) -> None:
        super().__init__(_NO_CONTAINER, app)
        self.process = process
        self.trace_dir = trace_dir
        self.queue = queue
        # the node name without "@host": the trace's ``worker`` field starts with it
        self.node_prefix = next(a for a in process.args if "@%h" in a).split("@")[0] + "@"

    def __repr__(self) -> str:
        state = "alive" if self.process.alive() else "dead"
        return f"<BeetleWorker {self.node_prefix}… pid={self.process.pid} {state}>"

    @property
    def version(self) -> str:
        return str(celery.__version__)

    @property
    def log_level(self) -> str:
        return "INFO"

    @property
    def worker_name(self) -> str:
        return self.node_prefix.rstrip("@")

    @property
    def worker_queue(self) -> str:
        return self.queue

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def hostname(self) -> str:
        return self.node_prefix

    def ready(self) -> bool:
        return self.process.alive()

    def config(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"queue": self.queue, "pid": self.process.pid}

    def logs(self) -> str:
        return self.process.log_text()

    def name(self) -> str:
        return self.worker_name

    def kill(self, signal: str | int = "SIGKILL", reload_container: bool = True) -> None:
        """kill -9 of the worker and its pool processes; ``SIGTERM``: a warm shutdown
        (running tasks finish, the trace is written)."""
        if _signum(signal) == signals.SIGTERM:
            self.process.stop()
        else:
            self.process.kill()

    def stop(self) -> None:
        """Warm shutdown: running tasks finish and the trace buffers are written."""
        self.process.stop()

    def restart(self, reload_container: bool = True, force: bool = False) -> None:
        """Start the worker again (after a kill: another process on the same queue)."""
        if self.process.alive():
            self.process.kill() if force else self.process.stop()
        self.process.start()

    def running_tasks(self) -> set[str]:
        """``queue/message_id`` of messages with a ``started`` event from this worker and
        no outcome yet, as far as the trace (written every second) shows."""
        started: set[str] = set()
        ended: set[str] = set()
        for path in sorted(self.trace_dir.glob("*.jsonl")):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                key = f"{rec.get('queue')}/{rec.get('message_id')}"
                if rec.get("event") == "started" and str(rec.get("worker")).startswith(
                    self.node_prefix
                ):
                    started.add(key)
                elif rec.get("event") in ("completed", "failed", "dead_lettered"):
                    ended.add(key)
        return started - ended

    def kill_mid_task(self, timeout: float = 30) -> set[str]:
        """Wait until a task runs in this worker, kill -9 it, and return what was running.

        The trace shows a ``started`` event within about a second, so the task must run for
        longer than that (a couple of seconds) to be caught mid-run.
        """
        running: set[str] = set()

        def busy() -> bool:
            running.update(self.running_tasks())
            return bool(running)

        if not wait_until(busy, timeout=timeout, interval=0.05):
            raise AssertionError(f"no task started in {self!r} within {timeout} s")
        self.process.kill()
        return running

    def teardown(self) -> None:
        self.process.kill()


class BeetleWorkerCluster(CeleryWorkerCluster):
    def __init__(self, *nodes: BeetleWorker) -> None:
        super().__init__(*nodes)

    @property
    def versions(self) -> set[str]:
        return {str(celery.__version__)}


class BeetleTestSetup(CeleryTestSetup):
    """``beetle_setup``: brokers, the dedup store, workers, the app and the test's trace.

    ``setup.app`` is the user's app configured for this test (publish with it, or with the
    tasks of its module: they are bound to the same app). ``setup.broker_cluster[i]``,
    ``setup.backend`` (the dedup store) and ``setup.worker`` carry the faults;
    :meth:`assert_exactly_once` reads the trace and fails with the verdict.
    """

    def __init__(
        self,
        worker_cluster: BeetleWorkerCluster | None,
        broker_cluster: BeetleBrokerCluster,
        backend_cluster: BeetleStoreCluster,
        app: Celery,
        trace_dir: Path,
    ) -> None:
        super().__init__(cast(Any, worker_cluster), broker_cluster, backend_cluster, app)
        self.trace_dir = trace_dir

    @property
    def brokers(self) -> BeetleBrokerCluster:
        return cast(BeetleBrokerCluster, self.broker_cluster)

    @property
    def store(self) -> BeetleStore:
        return cast(BeetleStore, self.backend)

    @property
    def workers(self) -> list[BeetleWorker]:
        cluster = self.worker_cluster
        return [cast(BeetleWorker, w) for w in cluster] if cluster else []

    def ready(self, ping: bool = False, control: bool = False, docker: bool = False) -> bool:
        """Every server answers and every worker runs (``ping``/``control`` as in
        pytest-celery; ``docker`` is ignored: there may be no engine)."""
        nodes = [*self.brokers, self.store, *self.workers]
        ready = all(node.ready() for node in nodes)
        if ready and (ping or control):
            ready = super().ready(ping=ping, control=control, docker=False)
        return ready

    def verdict(self) -> Verdict:
        """The naive audit's verdict on the trace so far."""
        return verdicts.judge_trace(self.trace_dir)

    def assert_exactly_once(
        self, expected: int | None = None, timeout: float = 60, stop_workers: bool = True
    ) -> Verdict:
        """Wait (up to ``timeout``) until every confirmed message has an outcome, stop the
        workers warmly (so their traces are complete) unless told not to, and fail with the
        verdict (lost / duplicated / unexpected ids) unless each ran exactly once."""
        verdicts.wait_for_outcomes(self.trace_dir, timeout)
        if stop_workers:
            for worker in self.workers:
                worker.stop()
        return verdicts.assert_exactly_once(self.trace_dir, expected)

    def teardown(self) -> None:
        for worker in self.workers:
            worker.teardown()
