"""A package's sdist from PyPI, its test tree unpacked into a directory of our own.

Only ``t/`` and the file holding the package's pytest settings are unpacked: the sdist's
root also holds the package's sources, which would shadow the installed package on
``sys.path`` when pytest runs the suite from there.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

__all__ = ["SdistError", "installed_version", "unpack_tests"]

#: the files of an sdist's root that hold its pytest settings (markers, ``xfail_strict``)
SETTINGS = ("pyproject.toml", "setup.cfg")


class SdistError(RuntimeError):
    """The sdist could not be downloaded or holds no test tree."""


def installed_version(package: str) -> str:
    return metadata.version(package)


def unpack_tests(package: str, version: str, into: Path) -> Path:
    """``into/<package>-<version>`` holding the sdist's ``t/``; downloaded only once."""
    root = into / f"{package}-{version}"
    if (root / "t" / "integration").is_dir():
        return root
    into.mkdir(parents=True, exist_ok=True)
    archive = _download(package, version, into)
    prefix = f"{package}-{version}/"
    wanted = [f"{prefix}t/", *(prefix + name for name in SETTINGS)]
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if any(_within(m.name, w) for w in wanted)]
        if not any(m.name.startswith(f"{prefix}t/integration/") for m in members):
            raise SdistError(f"{archive.name} holds no t/integration suite")
        tar.extractall(into, members=members, filter="data")
    return root


def _within(name: str, wanted: str) -> bool:
    return name.startswith(wanted) if wanted.endswith("/") else name == wanted


def _download(package: str, version: str, into: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--no-binary", ":all:", f"{package}=={version}", "--dest", str(into),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    found = sorted(into.glob(f"{package}-{version}.tar.gz"))
    if done.returncode or not found:
        raise SdistError(
            f"could not download the sdist of {package}=={version} with pip "
            f"(exit {done.returncode}): {done.stderr.strip()[-500:]}"
        )
    return found[0]
