"""The module paths that moved into the wings (#29) still import for one release: with a
DeprecationWarning naming the new path, as the new module itself."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from celery_beetle._moved import MOVED, REMOVED_IN

ROOT = Path(__file__).resolve().parents[2]


def test_an_old_path_warns_and_gives_the_new_module_itself():
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "from celery_beetle.worker import run\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    from celery_beetle.run import HandBack\n"
        "    import celery_beetle.gate as old_gate\n"
        "import celery_beetle.worker.gate as gate\n"
        "assert HandBack is run.HandBack and old_gate is gate, (HandBack, old_gate)\n"
        "assert gate.__spec__.name == 'celery_beetle.worker.gate', gate.__spec__\n"
        "for w in caught:\n"
        "    print(w.category.__name__, w.filename, w.lineno, w.message)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [
        "DeprecationWarning <string> 6 celery_beetle.run moved to celery_beetle.worker.run: "
        f"import it from there (celery_beetle.run goes in {REMOVED_IN})",
        "DeprecationWarning <string> 7 celery_beetle.gate moved to celery_beetle.worker.gate: "
        f"import it from there (celery_beetle.gate goes in {REMOVED_IN})",
    ]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_path_imports_as_its_new_module_and_has_no_file_left(old):
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])
    path = ROOT.joinpath(*old.split("."))
    assert not path.with_suffix(".py").exists() and not path.is_dir()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_result_naming_an_exception_by_its_old_path_still_loads():
    from celery_beetle import AttemptsExhausted

    data = pickle.dumps(AttemptsExhausted("started 3 times"), protocol=0)
    old = data.replace(b"celery_beetle.worker.errors", b"celery_beetle.run")
    assert old != data
    loaded = pickle.loads(old)
    assert type(loaded) is AttemptsExhausted and loaded.args == ("started 3 times",)


def test_a_name_that_left_a_module_warns_and_is_read_from_its_new_module():
    from celery_beetle import metrics
    from celery_beetle.worker.metrics import GateCollector

    with pytest.warns(DeprecationWarning, match="moved to celery_beetle.worker.metrics"):
        old = metrics.GateCollector
    assert old is GateCollector
    with pytest.raises(AttributeError):
        metrics.NoSuchCollector  # noqa: B018
