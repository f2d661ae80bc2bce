"""Every directory of shipped files is a package of the build, so setuptools installs it
without warning that it is "absent from the packages configuration"."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

setuptools = pytest.importorskip("setuptools")

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("kombu_beetle", "celery_beetle")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _packages() -> set[str]:
    """The packages setup.cfg's ``packages`` and ``[options.packages.find]`` name."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    find = config["options.packages.find"]
    finders = {
        "find:": setuptools.find_packages,
        "find_namespace:": setuptools.find_namespace_packages,
    }
    finder = finders[config["options"]["packages"].strip()]
    return set(
        finder(
            where=str(ROOT),
            include=_lines(find.get("include", "")),
            exclude=_lines(find.get("exclude", "")),
        )
    )


def test_every_directory_of_shipped_files_is_a_package_of_the_build():
    shipped = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for top in PROJECT
        for path in (ROOT / top).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    packages = _packages()
    assert {"celery_beetle.store.scripts", "celery_beetle.outbox.migrations.versions"} <= shipped
    assert shipped - packages == set()
    assert not [name for name in packages if "__pycache__" in name]


def test_building_the_wheel_writes_nothing_into_the_checkout(tmp_path):
    """``pip install .`` builds in a temporary directory: no ``build/``, no ``*.egg-info``."""
    import shutil
    import subprocess
    import sys

    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    tree = tmp_path / "checkout"
    for name in files:
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    before = set(tree.iterdir())
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", str(tmp_path / "wheels"), str(tree)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert list((tmp_path / "wheels").glob("kombu_beetle-*.whl"))
    assert set(tree.iterdir()) - before == set()
