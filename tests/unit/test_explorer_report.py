"""The soak's page (:mod:`celery_beetle.testing.explorer.report`), written from made-up
scenarios: no servers."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from celery_beetle.testing.explorer.report import Row, write_report

T0 = 1_790_000_000.0
PNG = b"\x89PNG\r\n\x1a\n"


def _rows() -> list[Row]:
    passed = [
        Row(
            seed=100 + n,
            ended_at=T0 + 40 * (n + 1),
            elapsed_s=35.0 + n,
            messages=80,
            faults={"worker_kill": 1, "broker_kill": n % 2},
        )
        for n in range(5)
    ]
    failed = Row(
        seed=106,
        ended_at=T0 + 260,
        elapsed_s=51.2,
        messages=120,
        faults={"redis_refuse": 1, "relay_kill": 1},
        violations=("[success_dead] s106-21-ab12cd: dead-lettered <not_retryable> (work:ok)",),
        findings=("new: a returned body's completion not stored in time (pool=prefork)",),
        story=(
            "[success_dead] s106-21-ab12cd: dead-lettered <not_retryable> (work:ok)",
            "s106-21-ab12cd: work:ok (item 21), publish confirmed=True",
            "12:01:02.345 trace  pid 77 started broker=0 attempt=1",
        ),
        replay="scripts/explore --seed 106",
        regression_test="tests/explorer/test_seed_106.py",
    )
    return [*passed, failed]


def _images(page: str) -> list[bytes]:
    found = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return [base64.b64decode(data) for data in found]


def test_the_page_charts_the_soak_and_tells_each_failure_with_its_replay_and_story(
    tmp_path: Path,
):
    page = write_report(tmp_path / "soak" / "report.html", _rows(), T0).read_text()
    images = _images(page)
    assert len(images) == 3 and all(png.startswith(PNG) for png in images)
    for chart in ("scenarios over time", "faults per kind", "messages judged"):
        assert f'alt="{chart}"' in page
    assert "1 of 6 scenarios failed" in page
    assert "<td>messages judged</td><td>520</td>" in page
    failure = page[page.index('id="seed-106"') :]
    assert "<code>scripts/explore --seed 106</code>" in failure
    assert "tests/explorer/test_seed_106.py" in failure
    assert "s106-21-ab12cd: work:ok (item 21), publish confirmed=True" in failure
    assert "&lt;not_retryable&gt;" in failure  # escaped, not markup
    assert 'id="seed-101"' not in page  # a passing seed has no section


def test_a_soak_without_failures_or_faults_says_so(tmp_path: Path):
    rows = [Row(seed=7, ended_at=T0 + 30, elapsed_s=30.0, messages=12)]
    page = write_report(tmp_path / "report.html", rows, T0).read_text()
    assert "the scenario passed" in page
    assert "<h2>Failures</h2><p>none</p>" in page
    assert len(_images(page)) == 3
