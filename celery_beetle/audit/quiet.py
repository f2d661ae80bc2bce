"""A local audit's JVM starts quietly: what the project can quiet at the source, it does; the
one line it cannot, it filters.

- log4j2: the audit's own file (:data:`LOG4J2_FILE`, errors only), given to the JVM before it
  starts, so Spark neither announces its default profile and level nor warns about the native
  Hadoop library (``setLogLevel`` comes too late for those);
- the host's address: a local run binds to the loopback (``SPARK_LOCAL_IP``), so Spark does
  not warn that the hostname resolves to it;
- ``WARNING: Using incubator modules: jdk.incubator.vector``: the JVM itself prints it for an
  option Spark's launcher always adds; :func:`filtered_stderr` drops that line from the JVM's
  stderr and passes every other line through (a real error still shows).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOG4J2_FILE", "NOISE", "filtered_stderr", "java_options", "local_environment"]

LOG4J2_FILE = Path(__file__).with_name("log4j2.properties")

#: Lines of a JVM's start that say nothing to an audit's reader.
NOISE = (
    "WARNING: Using incubator modules",
    "Using Spark's default log4j profile",
    "Setting default log level to",
    "To adjust logging level use sc.setLogLevel",
    "WARN NativeCodeLoader",
    "WARN Utils: Your hostname",
    "WARN Utils: Set SPARK_LOCAL_IP",
)


def java_options() -> str:
    return f"-Dlog4j2.configurationFile=file:{LOG4J2_FILE}"


def local_environment() -> None:
    """A local run binds to the loopback, and runs its Python workers on the driver's own
    interpreter (Spark refuses workers of another Python version), unless the user chose."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def is_noise(line: str) -> bool:
    return any(marker in line for marker in NOISE)


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """While the JVM starts (it inherits file descriptor 2), point descriptor 2 at a pipe whose
    reader drops :data:`NOISE` and copies the rest to the real stderr, for the JVM's life."""
    try:
        real = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no descriptor 2 to speak of: nothing to filter
        yield
        return
    threading.Thread(target=_copy, args=(read_end, real), daemon=True, name="jvm-stderr").start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        os.dup2(real, 2)  # this process writes to the real stderr again; the JVM keeps the pipe


def _copy(read_end: int, real: int) -> None:
    with os.fdopen(read_end, "rb") as source:
        for raw in source:
            if not is_noise(raw.decode(errors="replace")):
                os.write(real, raw)
