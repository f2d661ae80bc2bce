"""The nemesis: a thread that injects a scenario's faults at their times, then heals them.

Every fault acts on a real process by its pid (SIGKILL, SIGTERM, SIGSTOP) or on a real
server through its own interface (Redis ``CONFIG SET maxmemory 1`` to refuse writes,
``SCRIPT FLUSH``), or runs the operator's own command (``beetle queues migrate``, ``beetle
dead replay``) as a subprocess. Each is recorded with its wall-clock time and, for a
SIGKILL, the pids it killed: the checker needs them to decide whether a body that returned
could have lost its completion (:mod:`.checker`). A fault heals itself after its
``duration_s`` (a killed process restarts, a frozen one resumes), so a run always ends with
every server up and every worker slot filled, but a broker destroyed for good
(``broker_destroy``), which stays down until the run is judged.

The third version's faults: ``relay_kill`` (the run's ``beetle relay``, SIGKILL, restarted
after ``duration_s``), ``broker_destroy`` (a node killed -9 and never brought back into the
run: its copies and dead letters are gone for good; drawn only with three brokers, one
being within N-2), ``queues_apply`` (``beetle queues apply`` of policies that bound nothing
the run reaches, a day's TTL and a million messages, to the run's queues on every broker)
and ``latency`` (``delay_ms`` added each way on one broker's link, or Redis's, through the
proxy, for ``duration_s``). The fifth version's ``queues_bound``: ``beetle queues apply``
of a small TTL or max-length on the run's queues for ``duration_s``, then the generous ones.
The sixth version's: ``redis_failover``, ``replica_lag``, ``broker_replace`` and
``worker_upgrade``; in a scenario whose store is a Sentinel's, ``redis_kill`` and the Redis
link's faults are skipped (the clients reach its nodes directly) and ``redis_refuse`` and
``script_flush`` act on its master. A fault that finds nothing to act on (a broker fault
aimed at a destroyed node) is logged as skipped and not counted. A migration that stops
(a server away for a moment) is run again with ``--resume``, as an operator would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery_beetle.testing.redis_faults import refusing_writes
from celery_beetle.testing.worker import _children

if TYPE_CHECKING:
    from celery_beetle.testing.explorer.run import Run

__all__ = ["Nemesis"]

#: how many times the operator runs a migration that stopped again (``--resume``)
MIGRATE_RESUMES = 3
#: bounds no run reaches: a day's TTL, a million messages per queue
GENEROUS = {"message_ttl_ms": 86_400_000, "max_length": 1_000_000}


class Nemesis(threading.Thread):
    """Applies ``run.scenario.faults`` in order; :attr:`kills` and :attr:`counts` for the
    checker, :attr:`log` a line per fault for the report."""

    def __init__(self, run: Run) -> None:
        super().__init__(daemon=True, name="explorer-nemesis")
        self.run_ = run
        self.kills: list[tuple[float, set[int]]] = []
        #: (from, to) wall-clock times Redis could not take a completion (killed, refusing
        #: writes, cut off, replies held)
        self.redis_outages: list[tuple[float, float]] = []
        self.counts: Counter[str] = Counter()
        self.log: list[str] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.helpers: list[subprocess.Popen[bytes]] = []  # migrate / replay commands
        #: (sixth version) per Sentinel failover: when the master was killed, how long its
        #: replica had been cut off before, whether writes waited for a replica
        self.failovers: list[tuple[float, float, bool]] = []
        #: threads that resume a migration that stopped (:meth:`_resume_migration`)
        self.operators: list[threading.Thread] = []
        #: per ``broker_replace`` (sixth version) and ``broker_destroy``: when the node was
        #: killed, and which broker (what it held before then is gone)
        self.replacements: list[tuple[float, int]] = []

    def run(self) -> None:
        for fault in self.run_.scenario.faults:
            wait = self.run_.started + fault.at_s - time.monotonic()
            if wait > 0 and self.stopping.wait(wait):
                return
            try:
                handler = getattr(self, f"_{fault.kind}")
                if fault.kind == "latency":
                    applied = handler(fault.target, fault.duration_s, fault.delay_ms)
                elif fault.kind == "queues_bound":
                    applied = handler(fault.target, fault.duration_s, fault.bound)
                elif fault.kind == "redis_failover":
                    applied = handler(fault.duration_s, fault.lag_s)
                else:
                    applied = handler(fault.target, fault.duration_s)
                when = f"{time.monotonic() - self.run_.started:6.1f}s"
                if applied is False:
                    self.log.append(f"{when} {fault.kind} skipped: nothing to act on")
                    continue
                self.counts[fault.kind] += 1
                self.log.append(f"{when} {fault.kind}")
            except Exception as exc:  # a fault that could not be applied is noted, not fatal
                self.errors.append(f"{fault.kind}: {type(exc).__name__}: {exc}")

    # -- workers -----------------------------------------------------------------------------

    def _worker_kill(self, target: int, duration_s: float) -> None:
        fleet = self.run_.fleet
        slot = target % len(fleet.slots)
        worker = fleet.slots[slot]
        if worker is None or not worker.alive():
            return
        pids = {worker.pid or 0, *_children(worker.pid or 0)}
        worker.kill()
        # noted once every one is dead: a pool process runs on (and may begin a body) until
        # its own SIGKILL lands, after its parent's (the explorer's seed 5028)
        self.kills.append((time.time(), pids))
        self.stopping.wait(duration_s)
        fleet.start(slot)

    def _worker_term(self, target: int, duration_s: float) -> None:
        fleet = self.run_.fleet
        slot = target % len(fleet.slots)
        worker = fleet.slots[slot]
        if worker is None or not worker.alive():
            return
        worker.stop(timeout=self.run_.scenario.settings.timeout_s * 2 + 10)
        self.stopping.wait(duration_s)
        fleet.start(slot)

    def _worker_upgrade(self, target: int, duration_s: float) -> bool:
        """The previous release's worker stopped warmly, the current code started in its
        slot: a rolling deploy's step."""
        fleet = self.run_.fleet
        slot = fleet.previous_slot
        if slot is None:
            return False
        fleet.previous_slot = None
        worker = fleet.slots[slot]
        if worker is not None and worker.alive():
            worker.stop(timeout=self.run_.scenario.settings.timeout_s * 2 + 10)
        fleet.start(slot)
        return True

    def _pool_kill(self, target: int, duration_s: float) -> None:
        worker = self.run_.fleet.slots[target % len(self.run_.fleet.slots)]
        if worker is None or not worker.alive():
            return
        children = _children(worker.pid or 0)
        if children:
            pid = children[target % len(children)]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.kills.append((time.time(), {pid}))

    # -- servers -----------------------------------------------------------------------------

    def _broker_kill(self, target: int, duration_s: float) -> bool:
        n = target % len(self.run_.nodes)
        if n in self.run_.destroyed:
            return False
        node = self.run_.nodes[n]
        node.kill()
        self.stopping.wait(duration_s)
        if n not in self.run_.destroyed:  # destroyed meanwhile: it stays down
            node.start()
        return True

    def _broker_freeze(self, target: int, duration_s: float) -> bool:
        n = target % len(self.run_.nodes)
        if n in self.run_.destroyed:
            return False
        node = self.run_.nodes[n]
        node.pause()
        self.stopping.wait(duration_s)
        if n not in self.run_.destroyed:
            node.resume()
        return True

    def _broker_destroy(self, target: int, duration_s: float) -> bool:
        """Killed -9 and kept out of the run for good (the cluster brings a node back at
        that address only for the next scenario)."""
        run = self.run_
        n = target % len(run.nodes)
        if len(run.nodes) - len(run.destroyed) <= 2:
            return False  # within N-2: never the second broker of two
        run.destroyed.add(n)
        if run.nodes[n].is_paused:
            run.nodes[n].resume()
        run.nodes[n].kill()
        self.replacements.append((time.time(), n))
        return True

    def _redis(self) -> Any:
        """The Redis the dedup store writes to: the batch's, or the Sentinel's master now."""
        sentinel = self.run_.sentinel
        return sentinel.master() if sentinel is not None else self.run_.cluster.redis

    def _redis_kill(self, target: int, duration_s: float) -> bool:
        if self.run_.sentinel is not None:
            # a master without persistence restarted before its Sentinel noticed comes back
            # empty and its replica copies that: a data loss no setting guards against;
            # the Sentinel's kill is ``redis_failover``
            return False
        began = time.time()
        self.run_.cluster.redis.kill()
        self.stopping.wait(duration_s)
        self.run_.cluster.redis.start()
        self.redis_outages.append((began, time.time()))
        return True

    def _redis_refuse(self, target: int, duration_s: float) -> None:
        began = time.time()
        with refusing_writes(self._redis()):
            self.stopping.wait(duration_s)
        self.redis_outages.append((began, time.time()))

    def _script_flush(self, target: int, duration_s: float) -> None:
        with self._redis().client() as client:
            client.script_flush()

    # -- the sixth version: a Sentinel failover, a lagging replica, an empty broker ----------

    def _redis_failover(self, duration_s: float, lag_s: float) -> bool:
        """The Sentinel's master killed -9 (its replica first cut off for ``lag_s`` while
        the master acknowledges writes), the replica promoted, and the old master back as a
        replica ``duration_s`` after the promotion. Redis cannot store for the whole of it
        with ``wait_replicas`` (no replica until the old master is back), until the
        promotion without."""
        run = self.run_
        sentinel = run.sentinel
        if sentinel is None:
            return False
        waited = bool(run.scenario.settings.wait_replicas)
        began = time.time()
        old = sentinel.kill_master(unreplicated_s=lag_s)
        killed = time.time()
        self.failovers.append((killed, lag_s, waited))
        sentinel.wait_failover(old)
        promoted = time.time()
        self.stopping.wait(duration_s)
        sentinel.rejoin(old)
        self.redis_outages.append(
            (began if waited else killed, time.time() if waited else promoted)
        )
        return True

    def _replica_lag(self, target: int, duration_s: float) -> bool:
        """The replica frozen (SIGSTOP) for ``duration_s``: with ``wait_replicas`` no write
        is acknowledged meanwhile, and the store treats Redis as unreachable."""
        sentinel = self.run_.sentinel
        if sentinel is None:
            return False
        replica = sentinel.replica()
        began = time.time()
        replica.pause()
        self.stopping.wait(duration_s)
        replica.resume()
        if self.run_.scenario.settings.wait_replicas:
            self.redis_outages.append((began, time.time()))
        return True

    def _broker_replace(self, target: int, duration_s: float) -> bool:
        """A broker killed -9 and its data wiped; ``duration_s`` later an empty node starts
        on its port, and the operator recreates the run's vhost (and RabbitMQ 4's limits) as
        a definitions import would. The workers and publishers declare the queues again;
        what the old node held is gone, and each BeetleTask's copy on another broker must
        run once."""
        run = self.run_
        n = target % len(run.nodes)
        if n in run.destroyed:
            return False
        node = run.nodes[n]
        if node.is_paused:
            node.resume()
        node.kill()
        self.replacements.append((time.time(), n))
        run.replaced.add(n)
        shutil.rmtree(node.base_dir / "mnesia", ignore_errors=True)
        self.stopping.wait(duration_s)
        node.start()
        node.create_vhost(run.vhost)
        if run.scenario.settings.rabbit4:
            run.limit(node)
        return True

    # -- the network (a TCP proxy in front of each server) ----------------------------------

    def _link(self, target: int) -> Any:
        proxies = self.run_.proxies
        return proxies[target % len(proxies)]

    def _partition(self, target: int, duration_s: float) -> None:
        """Both ways: every connection reset, new ones refused (a link down)."""
        proxy = self._link(target)
        proxy.cut()
        self.stopping.wait(duration_s)
        proxy.restore()

    def _stall(self, target: int, duration_s: float) -> None:
        """Connections stay open and nothing moves (a host frozen behind a switch)."""
        proxy = self._link(target)
        proxy.stall()
        self.stopping.wait(duration_s)
        proxy.restore()

    def _held_replies(self, target: int, duration_s: float) -> None:
        """Requests reach the broker, its replies are held: one way (lost replies)."""
        proxy = self._link(target)
        proxy.hold_replies()
        self.stopping.wait(duration_s)
        proxy.restore()

    def _latency(self, target: int, duration_s: float, delay_ms: int) -> bool:
        """``delay_ms`` more each way on one link: a broker's (``target`` below the number
        of brokers) or Redis's; restored after ``duration_s``."""
        run = self.run_
        if target >= len(run.proxies) and run.sentinel is not None:
            return False  # a Sentinel hands out its master's own address: no proxy between
        proxy = run.proxies[target] if target < len(run.proxies) else run.cluster.redis_proxy
        assert proxy is not None
        proxy.delay(delay_ms)
        self.stopping.wait(duration_s)
        proxy.restore()
        return True

    def _redis_partition(self, target: int, duration_s: float) -> bool:
        if self.run_.sentinel is not None:
            return False  # no proxy in front of a Sentinel's nodes
        proxy = self.run_.cluster.redis_proxy
        assert proxy is not None
        began = time.time()
        proxy.cut()
        self.stopping.wait(duration_s)
        proxy.restore()
        self.redis_outages.append((began, time.time()))
        return True

    def _redis_held_replies(self, target: int, duration_s: float) -> bool:
        """Redis applies the scripts; the replies are held (a claim whose reply was lost)."""
        if self.run_.sentinel is not None:
            return False
        proxy = self.run_.cluster.redis_proxy
        assert proxy is not None
        began = time.time()
        proxy.hold_replies()
        self.stopping.wait(duration_s)
        proxy.restore()
        self.redis_outages.append((began, time.time()))
        return True

    # -- operators' commands -----------------------------------------------------------------

    def _beetle(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-c", "from celery_beetle.cli import main; main()", *args]
        log = Path(self.run_.base / f"{name}.log")
        with log.open("ab") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self.helpers.append(proc)
        return proc

    def _migrate(self, target: int, duration_s: float) -> None:
        run = self.run_
        run.fleet.conf["task_default_queue_type"] = "quorum"  # what a restarted worker says
        args = ["queues", "migrate", "-Q", run.queue, "--broker", run.url, "--redis", run.redis_url]
        args += ["--settle-s", "1", "--queue-type", "quorum"]
        for node, proxy in zip(run.nodes, run.proxies, strict=True):
            api = f"http://{node.host}:{node.management_port}"
            args += ["--management-url", f"{proxy.host_port}={api}"]
        proc = self._beetle("migrate", *args)
        operator = threading.Thread(target=self._resume_migration, args=(proc, args), daemon=True)
        operator.start()
        self.operators.append(operator)

    def _resume_migration(self, proc: subprocess.Popen[bytes], args: list[str]) -> None:
        """The operator's part when a migration stops (a broker or the store away for a
        moment, a Sentinel failing over): operations.md says to run it again with
        ``--resume``, and the workers hold the queue handed back until then. A few times,
        seconds apart; one that never began is run again from the start."""
        log = self.run_.base / "migrate.log"
        for _ in range(MIGRATE_RESUMES):
            code = proc.wait()
            if code == 0 or self.stopping.wait(3):
                return
            never_began = "no migration of" in log.read_text(errors="replace")[-2000:]
            self.log.append(f"queues migrate: exit {code}, run again")
            proc = self._beetle("migrate", *args, *([] if never_began else ["--resume"]))

    def _queues_apply(self, target: int, duration_s: float) -> None:
        """``beetle queues apply`` of policies that bound nothing the run reaches: a day's
        TTL and a million messages per queue (operations.md "Queue policies")."""
        self._beetle("queues_apply", *self._apply_args(GENEROUS))

    def _queues_bound(self, target: int, duration_s: float, bound: int) -> None:
        """``beetle queues apply`` of a TTL of ``bound`` ms (``target`` 0) or a max-length
        of ``bound`` messages (``target`` 1) on the run's queues, for ``duration_s``, then
        the generous bounds of :meth:`_queues_apply` (a policy cannot be taken away by the
        command). What expires or overflows meanwhile is dead-lettered by RabbitMQ into
        ``<queue>.dead`` (the policy's dead-letter route) with ``x-death`` reason
        ``expired`` or ``maxlen``."""
        bounds = {"message_ttl_ms": bound} if target % 2 == 0 else {"max_length": bound}
        self._apply_now(bounds)
        self.stopping.wait(duration_s)
        self._apply_now(GENEROUS)

    def _apply_args(self, bounds: dict[str, int]) -> list[str]:
        run = self.run_
        config = run.base / f"policies-{len(self.helpers)}.json"
        config.write_text(json.dumps({"queues": {queue: bounds for queue in run.queues}}))
        args = ["queues", "apply", "--broker", run.url, "--config", str(config)]
        for node, proxy in zip(run.nodes, run.proxies, strict=True):
            api = f"http://{node.host}:{node.management_port}"
            args += ["--management-url", f"{proxy.host_port}={api}"]
        return args

    def _apply_now(self, bounds: dict[str, int]) -> None:
        """``beetle queues apply`` of ``bounds``, waited for (bounded: 60 s)."""
        proc = self._beetle("queues_bound", *self._apply_args(bounds))
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode:
            self.errors.append(f"queues apply {bounds}: exit {proc.returncode}")

    def _relay_kill(self, target: int, duration_s: float) -> bool:
        relay = self.run_.relay
        if relay is None:
            return False
        relay.kill()  # not in :attr:`kills`: no body runs in the relay
        self.stopping.wait(duration_s)
        relay.start()
        return True

    def _replay(self, target: int, duration_s: float) -> None:
        run = self.run_
        args = ["dead", "replay", "-Q", run.queue, "--all", "--broker", run.url]
        self._beetle("replay", *args, "--redis", run.redis_url, "--trace-dir", str(run.trace))

    # -- the end -----------------------------------------------------------------------------

    def finish(self, timeout: float) -> None:
        """Wait for the schedule and the commands it started (bounded), killing what is
        left; every process this thread started is gone when it returns."""
        self.join(timeout)
        if self.is_alive():
            self.stopping.set()
            self.join(30)
        for operator in self.operators:
            operator.join(120)
        deadline = time.monotonic() + 60
        for proc in self.helpers:
            try:
                if proc.wait(max(0.1, deadline - time.monotonic())):
                    # not a fault of the run (a migration refused mid-fault, an API of a
                    # destroyed broker): its log under the run's directory says why
                    command = " ".join(map(str, list(proc.args)[3:5]))  # type: ignore[arg-type]
                    self.log.append(f"{command}: exit {proc.returncode}")
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.errors.append(f"{proc.args!r} did not end within 60 s: killed")

    def describe(self) -> dict[str, Any]:
        return {"faults": dict(self.counts), "log": self.log, "errors": self.errors}
