"""A class-data archive for the audit's local JVM: Spark starts in half the time.

Most of a small audit's wall time is the JVM loading and verifying Spark's classes: about
4.5 s to a session and 3 s more to its first job on two cores. Java's class-data sharing
(CDS) keeps those classes, already parsed and verified, in an archive that the next JVM maps
from disk: 2.3 s and 1.7 s.

The first local audit on a machine writes the archive as its JVM exits
(``-XX:ArchiveClassesAtExit``) to a temporary file; :func:`publish` waits for that JVM to end
and only then renames the file into place, because a JVM that maps a truncated archive
crashes (SIGBUS). Every later audit maps it (``-XX:SharedArchiveFile``). The archive's name
holds a digest of the Java runtime and of Spark's jars, so an upgrade of either makes a new
one instead of using a stale one.

Writing it costs that first audit about 20 s (the JVM records as it runs, then writes
170 MB as it exits), so ``scripts/setup-env`` builds it ahead with a tiny audit
(:mod:`celery_beetle.audit.warm`: the audit's job uses this module, and the warm-up uses
the job). The archive lives under
``$XDG_CACHE_HOME/beetle`` (``~/.cache/beetle``); the three most recently used are kept.
``BEETLE_AUDIT_CLASS_CACHE`` names another directory, or ``off``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "archive_path", "java_options", "publish"]

CACHE_ENV = "BEETLE_AUDIT_CLASS_CACHE"
#: A temporary archive younger than this is another audit's dump in progress: leave it be.
DUMP_IN_PROGRESS_S = 600
#: How long :func:`publish` waits for the JVM to write the archive and exit.
EXIT_TIMEOUT_S = 120
#: The JVM's notes about classes it cannot archive (signed jars, old class files) are many
#: and harmless: keep them off the audit's output.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

#: Archives kept (one per Java runtime and Spark seen lately; each about 170 MB).
KEEP = 3

#: The temporary archive this process's JVM writes at exit, when it writes one.
_dumping: Path | None = None


def _cache_dir() -> Path | None:
    setting = os.environ.get(CACHE_ENV, "")
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "beetle"


def archive_path() -> Path | None:
    """Where this Java runtime and this Spark keep their archive; None when switched off or
    when Java cannot be found."""
    directory = _cache_dir()
    java = _java_binary()
    if directory is None or java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    digest = hashlib.sha256()
    for path in [java, *sorted(jars.glob("*.jar"))]:
        stat = path.stat()
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return directory / f"spark-{pyspark.__version__}-{digest.hexdigest()[:16]}.jsa"


def _java_binary() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.exists(found) else None


def java_options(*, write: bool = True) -> str:
    """JVM options for a local session about to start its JVM: map the archive when there is
    one, else (with ``write``) write one at exit unless another audit is writing it now.
    Empty when the cache is off or its directory cannot be written."""
    global _dumping
    path = archive_path()
    if path is None or " " in str(path):  # Spark splits its JVM options at spaces
        return ""
    if path.is_file() and path.stat().st_size > 0:
        try:
            os.utime(path)  # recently used: kept when older ones are cleared
        except OSError:
            pass
        return f"-XX:SharedArchiveFile={path} {QUIET}"
    if not write:
        return ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for other in path.parent.glob(f"{path.name}.*.tmp"):
            if now - other.stat().st_mtime < DUMP_IN_PROGRESS_S:
                return ""
            other.unlink(missing_ok=True)  # left by an audit killed while it wrote
        dumping = path.parent / f"{path.name}.{os.getpid()}.tmp"
        dumping.touch()
    except OSError:
        return ""
    _dumping = dumping
    return f"-XX:ArchiveClassesAtExit={dumping} {QUIET}"


def publish(spark: Any) -> None:
    """When this process's JVM is writing the archive: stop Spark, let the JVM exit, and put
    the archive in place once the JVM has ended cleanly. Otherwise nothing."""
    global _dumping
    dumping, _dumping = _dumping, None
    if dumping is None:
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    try:
        spark.stop()
        if proc is None:
            return
        if gateway is not None:
            gateway.shutdown()
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits at the end of its input
        proc.wait(timeout=EXIT_TIMEOUT_S)
        SparkContext._gateway = None
        SparkContext._jvm = None
        if proc.returncode == 0 and dumping.stat().st_size > 0:
            os.replace(dumping, dumping.with_name(dumping.name.rsplit(".", 2)[0]))
            _clear_old(dumping.parent)
    except Exception:  # the archive is only a speed-up: it must never fail the audit
        pass
    finally:
        dumping.unlink(missing_ok=True)


def _clear_old(directory: Path) -> None:
    archives = sorted(directory.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime)
    for old in archives[:-KEEP]:
        old.unlink(missing_ok=True)
