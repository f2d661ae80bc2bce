"""Slow links for a benchmark: a process of TCP proxies that hold every byte a while.

``tc netem`` needs a kernel module that a container may lack, so latency comes from the
project's own proxy (:class:`celery_beetle.testing.proxy.TcpProxy` with ``delay``), one per
server, all in one child process so that their CPU is counted apart from the worker's and the
servers'. Run as ``python -m benchmarks._links MS HOST:PORT ...``: it prints the proxies'
ports on one line and forwards until stdin closes."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def slow_links(ms: float, targets: list[int]) -> Iterator[tuple[dict[int, int], int]]:
    """Yield ({target port: proxy port}, the proxies' pid): each proxy on 127.0.0.1 holds
    every byte ``ms`` milliseconds each way before writing it on."""
    args = [sys.executable, "-m", "benchmarks._links", str(ms), *map(str, targets)]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline().decode()
        ports = [int(p) for p in line.split()]
        if len(ports) != len(targets):
            raise SystemExit(f"the link proxies did not start: {line!r}")
        yield dict(zip(targets, ports, strict=True)), proc.pid
    finally:
        proc.stdin.close()
        proc.wait(30)


def _serve(ms: float, targets: list[int]) -> None:
    from celery_beetle.testing.proxy import TcpProxy

    proxies = [TcpProxy("127.0.0.1", port).start() for port in targets]
    for proxy in proxies:
        proxy.delay(ms)
    print(" ".join(str(proxy.port) for proxy in proxies), flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
    for proxy in proxies:
        proxy.close()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _serve(float(sys.argv[1]), [int(p) for p in sys.argv[2:]])
