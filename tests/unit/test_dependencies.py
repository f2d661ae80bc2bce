"""``pip install kombu-beetle`` installs what the ``beetle`` command imports.

rich sat in two extras only, so ``beetle status`` failed with ``ModuleNotFoundError: rich``
in a virtualenv with just ``[pytest]``. The scan below follows the imports of the console
script's module through the project's modules (at any depth: a command imports what it
needs when it runs) and checks every third-party module against setup.cfg: installed by
``install_requires`` (or what those require), or named in :data:`OPTIONAL` with the extra
that installs it, for the commands that say so (``beetle audit``, ``beetle outbox``, the
``--metrics`` of ``beetle status --watch``).
"""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("celery_beetle", "kombu_beetle")

#: third-party modules only some commands need -> the extra that installs them
OPTIONAL = {
    "pyspark": "audit",
    "matplotlib": "audit",
    "sqlalchemy": "outbox",
    "alembic": "outbox",
    "psycopg": "outbox",
    "prometheus_client": "metrics",
}


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    return config


def _requirements(text: str) -> list[Requirement]:
    return [Requirement(line) for line in text.splitlines() if line.strip()]


def _console_script_modules() -> list[str]:
    scripts = _setup_cfg()["options.entry_points"]["console_scripts"]
    return [
        line.partition("=")[2].strip().partition(":")[0]
        for line in scripts.splitlines()
        if line.strip()
    ]


def _module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(name: str, path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth, absolute (``from x import y``: x and x.y)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*parts, *([module] if module else [])])
            found += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return found


def third_party_imports(start: list[str]) -> dict[str, set[str]]:
    """Top-level third-party module -> the project's modules importing it, from ``start``."""
    seen: set[str] = set()
    todo = list(start)
    third_party: dict[str, set[str]] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is None:  # a name imported from a module, not a module
            continue
        for imported in _imported_names(name, path):
            parts = imported.split(".")
            if parts[0] in PROJECT:
                todo += [".".join(parts[: i + 1]) for i in range(len(parts))]  # and parents
            elif parts[0] not in sys.stdlib_module_names and parts[0] != "__future__":
                third_party.setdefault(parts[0], set()).add(name)
    return third_party


def _closure(requirements: list[Requirement]) -> set[str]:
    """The distributions ``requirements`` install, with what they require (their markers
    read for the extras asked for), from the installed metadata."""
    found: set[str] = set()
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            nested = Requirement(text)
            extras = ("", *requirement.extras)
            if nested.marker is None or any(nested.marker.evaluate({"extra": e}) for e in extras):
                todo.append(nested)
    return found


def _distributions(module: str) -> set[str]:
    names = metadata.packages_distributions().get(module) or [module]
    return {canonicalize_name(name) for name in names}


def test_the_scan_finds_what_the_commands_import_when_they_run():
    found = third_party_imports(_console_script_modules())
    assert {"click", "rich", "celery", "kombu", "amqp", "redis"} <= set(found)
    assert "celery_beetle.cli.status" in found["rich"]  # imported inside `beetle status`


def test_every_third_party_module_the_beetle_command_imports_is_installed_with_it():
    config = _setup_cfg()
    installed = _closure(_requirements(config["options"]["install_requires"]))
    extras = {
        extra: {canonicalize_name(r.name) for r in _requirements(text)}
        for extra, text in config["options.extras_require"].items()
    }
    missing = {}
    for module, importers in third_party_imports(_console_script_modules()).items():
        dists = _distributions(module)
        if dists & installed:
            continue
        extra = OPTIONAL.get(module)
        if extra is not None and dists & extras.get(extra, set()):
            continue
        missing[module] = sorted(importers)
    assert not missing, f"add to install_requires in setup.cfg (imported by): {missing}"


def test_beetle_starts_and_shows_its_help_without_the_optional_extras():
    blocked = ", ".join(repr(module) for module in OPTIONAL)
    script = (
        "import sys\n"
        f"for name in ({blocked},): sys.modules[name] = None  # importing it fails\n"
        "from celery_beetle.cli import main\n"
        "for args in ([], ['status'], ['outbox'], ['dead-letters'], ['queues'], ['fleet']):\n"
        "    try:\n"
        "        main([*args, '--help'])\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (args, exc.code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: " in result.stdout


def test_an_outbox_command_without_the_outbox_extra_says_which_extra_to_install():
    script = (
        "import sys\n"
        "sys.modules['sqlalchemy'] = None  # importing it fails\n"
        "from click.testing import CliRunner\n"
        "from celery_beetle.cli import main\n"
        "db = ['--db', 'postgresql://shop:pw@db.example/shop']\n"
        "for args in (['outbox', 'init'], ['outbox', 'list'], ['outbox', 'drop', 'x'],\n"
        "             ['outbox', 'retry', '--all'], ['outbox', 'sweep'],\n"
        "             ['relay', '--broker', 'beetle://h1,h2/']):\n"
        "    result = CliRunner().invoke(main, [*args, *db])\n"
        "    assert result.exit_code == 1, (args, result.exit_code, result.exception)\n"
        "    assert \"pip install 'kombu-beetle[outbox]'\" in result.output, result.output\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
