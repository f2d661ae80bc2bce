"""The README's pytest setup works as written: ``beetle_app = shop.tasks:app`` in the ini of a
project whose package sits beside the ini file, with no ``pythonpath = .``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTEST = Path(sys.executable).with_name("pytest")


def _project(tmp_path: Path, package: str) -> Path:
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nbeetle_app = {package}.tasks:app\n")
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "tasks.py").write_text(
        f"from celery import Celery\n\napp = Celery({package!r}, set_as_current=False)\n"
    )
    (tmp_path / "tests").mkdir()
    # an initial conftest: loaded before pytest_configure, so the plugin must act earlier
    (tmp_path / "tests" / "conftest.py").write_text(f"import {package}.tasks  # noqa: F401\n")
    (tmp_path / "tests" / "test_shop.py").write_text(
        f"from {package}.tasks import app\n"
        "from celery_beetle.testing.app import load_app\n\n\n"
        "def test_the_tests_import_the_project():\n"
        f"    assert app.main == {package!r}\n\n\n"
        "def test_the_plugin_loads_the_app_the_ini_names(beetle_app_path):\n"
        "    assert load_app(beetle_app_path) is app\n"
    )
    return tmp_path


def _pytest(project: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),  # this checkout's plugin, not the project's directory
        "BEETLE_TEST_SERVERS": "local",  # no Docker probe: no test here starts a server
    }
    return subprocess.run(
        [str(PYTEST), "-p", "no:cacheprovider", "-q"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not PYTEST.exists(), reason="no pytest script beside this interpreter")
def test_a_project_beside_its_ini_file_is_importable_without_pythonpath(tmp_path: Path):
    result = _pytest(_project(tmp_path, "shop_beside_ini"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


@pytest.mark.skipif(not PYTEST.exists(), reason="no pytest script beside this interpreter")
def test_an_app_nowhere_to_be_found_is_still_an_import_error(tmp_path: Path):
    project = _project(tmp_path, "shop_elsewhere")
    (project / "pytest.ini").write_text("[pytest]\nbeetle_app = no_such_shop.tasks:app\n")
    (project / "tests" / "conftest.py").unlink()
    (project / "tests" / "test_shop.py").write_text(
        "import pytest\n\n\n"
        "def test_the_app_cannot_be_loaded(beetle_app_path):\n"
        "    from celery_beetle.testing.app import load_app\n\n"
        "    with pytest.raises(ImportError):\n"
        "        load_app(beetle_app_path)\n"
    )
    result = _pytest(project)
    assert result.returncode == 0, result.stdout + result.stderr
