"""CPU time of process trees, from /proc (Linux): a benchmark's workers, brokers and Redis.

Throughput moves with whatever else shares the machine's two cores; CPU time per task hardly
does, and it says where the cost went (the worker, the brokers, Redis)."""

from __future__ import annotations

import os
from pathlib import Path


def tree_cpu_s(pid: int, descendants: bool = True) -> float:
    """User + system CPU seconds of ``pid`` and (unless not ``descendants``) its descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue  # exited meanwhile
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        if descendants:
            todo.extend(int(c) for c in children)
    return total


def listener_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` of this machine (a broker or a Redis
    the benchmark did not start itself), or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(fields[9])
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(entry.name)
        except OSError:
            continue
    return None


class CpuMeter:
    """CPU seconds of named groups of process trees between :meth:`start` and :meth:`stop`;
    the groups named in ``alone`` count their processes without descendants."""

    def __init__(self, groups: dict[str, list[int]], alone: frozenset[str] = frozenset()) -> None:
        self.groups = groups
        self.alone = alone
        self._start: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {
            name: sum(tree_cpu_s(p, descendants=name not in self.alone) for p in pids)
            for name, pids in self.groups.items()
        }

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        now = self._now()
        self.used = {name: now[name] - self._start.get(name, now[name]) for name in now}
        return self.used
