"""The example alert rules load in Prometheus and fire when they should (``promtool``).

promtool comes with Debian's ``prometheus`` package (scripts/setup-env installs it); without
it these tests skip locally and fail under ``CI=true``, as a missing server does.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from celery_beetle.testing.servers import server_missing

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[1] / "examples" / "prometheus-alerts.yml"


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        server_missing("promtool (Debian's prometheus package)")
    assert found is not None
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=HERE)


def test_the_example_alert_rules_are_valid_prometheus_rules(promtool):
    done = _run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_alert_rules_fire_and_stay_quiet_as_their_unit_tests_expect(promtool):
    done = _run(promtool, "test", "rules", "alerts-test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
