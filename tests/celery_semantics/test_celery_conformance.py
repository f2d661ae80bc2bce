"""Celery's own ``t/integration/test_tasks.py`` (and ``test_canvas.py``'s chains with
chords) pass with every task a BeetleTask.

The suite of the installed Celery's sdist runs over ``pyamqp://`` (plain Celery) and, at
once, over ``beetle://`` on two brokers with every task a BeetleTask at the task options'
defaults (:mod:`celery_beetle.testing.conformance`): a test that passes over pyamqp must pass
under beetle too, but for the differences :data:`~.differences.DIFFERENCES` explains.
``scripts/conformance`` runs the same and more (``test_canvas.py``) by hand.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from celery_beetle.testing.conformance.cli import SUITES
from celery_beetle.testing.conformance.differences import DIFFERENCES
from celery_beetle.testing.conformance.overrides import CONFTEST
from celery_beetle.testing.conformance.results import compare
from celery_beetle.testing.conformance.runner import TRANSPORTS, run_suite, running_servers
from celery_beetle.testing.conformance.sdists import SdistError, installed_version, unpack_tests

pytestmark = pytest.mark.integration

#: downloaded once per machine, not once per run
SDISTS = Path(tempfile.gettempdir()) / "beetle-conformance" / "sdists"


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("suite", "select"),
    [
        pytest.param("tasks", None, id="test_tasks"),
        # the canvas suite takes 15 min over pyamqp alone: its chains with chords in CI
        pytest.param("canvas", "test_chain and chord", id="test_canvas-chains-with-chords"),
    ],
)
def test_celerys_own_suite_passes_with_every_task_a_beetle_task_as_over_pyamqp(
    tmp_path: Path, suite: str, select: str | None
):
    version = installed_version("celery")
    try:
        tree = unpack_tests("celery", version, SDISTS)
    except SdistError as exc:  # no network: skipped here, a failure under CI=true
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    (tree / "t" / "conftest.py").write_text(CONFTEST)
    trees = dict.fromkeys(TRANSPORTS, tree)
    with running_servers(tmp_path / "servers") as servers:
        runs = run_suite(
            trees, [SUITES[suite]], servers.environment, tmp_path / "runs",
            select=select, parallel=True,
        )  # fmt: skip
    comparison = compare(f"celery {version}", runs["pyamqp"].outcomes, runs["beetle"].outcomes)
    report = "\n".join(comparison.lines())
    unexplained = [test for test in comparison.failed_only_beetle if test not in DIFFERENCES]
    assert not unexplained, f"{report}\nlogs: {runs['beetle'].log}"
    assert len(comparison.passed_both) >= 25, report  # the suite ran, not just its setup
