"""Every setting of the project that can hold a credential is censored in Celery's reports.

``celery_beetle.settings.APP_SETTINGS`` marks each ``app.conf`` setting the project reads as
secret or not; these tests find the settings the source reads, so that a new one cannot be
left out of the table, and check each secret one against the three reports Celery offers:
``app.conf.humanize(censored=True)``, ``celery report`` (``app.bugreport()``) and ``celery
inspect conf`` (the worker's ``conf`` control command).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.worker import control

import celery_beetle
from celery_beetle.settings import _APP_OPTIONS, APP_SETTINGS, DEPRECATED_OPTIONS

SECRET = "Tr0ub4dor-s3cret"
SOURCE_ROOTS = [
    Path(celery_beetle.__file__).parent,
    Path(celery_beetle.__file__).parent.parent / "kombu_beetle",
]

#: ``conf.get("beetle_x")``, ``conf["beetle_x"]``, ``conf.beetle_x`` (app.conf or a local conf)
_READ = re.compile(r"""conf(?:\.get\(\s*|\[\s*)["'](beetle_\w+)["']|conf\.(beetle_\w+)\b""")

SECRET_SETTINGS = sorted(name for name, secret in APP_SETTINGS.items() if secret)

#: a credential in each shape a setting takes: a URL or DSN string, or a mapping of options
#: holding a password and URLs with userinfo (as ``beetle_management`` does)
SHAPES: dict[str, Any] = {
    "url": f"postgresql://shop:{SECRET}@db.example:5432/shop",
    "dsn": f"host=db.example dbname=shop user=shop password={SECRET}",
    "mapping": {
        "user": "ops",
        "password": SECRET,
        "urls": {"rabbit1:5672": f"https://ops:{SECRET}@rabbit1:15671"},
    },
}


def settings_read_in(source: str) -> set[str]:
    """The ``beetle_*`` settings a piece of source reads from a Celery configuration."""
    return {a or b for a, b in _READ.findall(source)}


def settings_read_by_the_project() -> set[str]:
    found = {f"beetle_default_{old}" for old in DEPRECATED_OPTIONS} | set(_APP_OPTIONS)
    for root in SOURCE_ROOTS:
        for path in root.rglob("*.py"):
            found |= settings_read_in(path.read_text(encoding="utf-8"))
    return found


def test_every_setting_the_project_reads_is_marked_secret_or_not_in_the_table():
    read = settings_read_by_the_project()
    assert {"beetle_redis_url", "beetle_outbox_db", "beetle_management"} <= read
    unmarked = read - set(APP_SETTINGS)
    assert not unmarked, f"add these to celery_beetle.settings.APP_SETTINGS: {sorted(unmarked)}"
    assert all(isinstance(secret, bool) for secret in APP_SETTINGS.values())


def test_a_setting_read_but_missing_from_the_table_is_caught():
    source = 'url = app.conf.get("beetle_vault_url")\ntoken = self.app.conf.beetle_vault_token\n'
    assert settings_read_in(source) == {"beetle_vault_url", "beetle_vault_token"}
    assert not settings_read_in(source) & set(APP_SETTINGS)


def test_the_settings_holding_credentials_are_marked_secret():
    assert {"beetle_redis_url", "beetle_outbox_db", "beetle_management"} <= set(SECRET_SETTINGS)


def _reports(app: Celery) -> dict[str, str]:
    return {
        "humanize(censored=True)": app.conf.humanize(with_defaults=False, censored=True),
        "table(censored=True)": str(app.conf.table(with_defaults=False, censored=True)),
        "celery report": app.bugreport(),
        "celery inspect conf": str(control.conf(SimpleNamespace(app=app))),
    }


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", SECRET_SETTINGS)
def test_every_secret_setting_is_censored_in_each_of_celerys_reports(name: str, shape: str):
    app = Celery(set_as_current=False)
    app.conf[name] = SHAPES[shape]
    celery_beetle.install(app)
    for report, text in _reports(app).items():
        assert SECRET not in text, f"{name} ({shape}) shown in {report}"
        assert name in text, f"{name} left out of {report}"


def test_a_setting_without_credentials_is_shown_as_written():
    app = Celery(set_as_current=False)
    app.conf.beetle_trace_dir = "/var/log/beetle-trace"
    app.conf.beetle_outbox_db = SHAPES["url"]
    celery_beetle.install(app)
    report = app.conf.humanize(with_defaults=False, censored=True)
    assert "beetle_trace_dir: '/var/log/beetle-trace'" in report
    assert "beetle_outbox_db: '********'" in report
