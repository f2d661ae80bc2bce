"""A py-spy profile of one process while a benchmark runs, summed by function.

``py-spy record --format raw`` writes one line per distinct stack with its sample count;
the summary counts each function once per sample it appears in (inclusive) and where it is
the innermost frame (self), so a reader sees both where the main process spends its time and
which of our functions lead there."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r" \(([^()]*?)(?::\d+)?\)$")


def start(
    pid: int, out: Path, rate: int = 250, subprocesses: bool = False
) -> subprocess.Popen[bytes] | None:
    """Start sampling ``pid`` (and with ``subprocesses`` its children: a prefork pool) into
    ``out``; None when py-spy is not installed."""
    beside = Path(sys.executable).parent / "py-spy"  # a virtualenv's, not on PATH unactivated
    binary = str(beside) if beside.exists() else shutil.which("py-spy")
    if binary is None:
        return None
    return subprocess.Popen(
        [binary, "record", "-p", str(pid), "-r", str(rate), "-f", "raw", "-o", str(out),
         "--nonblocking", *(["--subprocesses"] if subprocesses else [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file as it stops
        proc.wait(30)


def _function(frame: str) -> str:
    """``name (path/to/module.py:123)`` -> ``name (module.py)``."""
    match = _LINE.search(frame)
    if match is None:
        return frame
    name = frame[: match.start()]
    return f"{name} ({Path(match.group(1)).name})"


def summary(path: Path, top: int = 15, ours: tuple[str, ...] = ("_beetle",)) -> list[str]:
    """The ``top`` functions of this project (frames whose file path holds one of ``ours``)
    by inclusive samples, and the ``top`` of all by self samples, as printable lines."""
    if not path.exists():
        return [f"(no profile at {path})"]
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        raw = [f for f in stack.split(";") if f]
        frames = [_function(f) for f in raw]
        for name in {_function(f) for f in raw if any(o in f for o in ours)}:
            inclusive[name] += n
        if frames:
            own[frames[-1]] += n
    if not total:
        return ["(no samples)"]
    lines = [f"{total} samples; this project's functions, inclusive:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    lines.append("every function, self:")
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    return lines
