"""The dependency floors: declared once in setup.cfg, held by install() at worker start."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured

import celery_beetle
from celery_beetle import versions
from celery_beetle.versions import FLOORS, below_floor, parse_version

ROOT = Path(__file__).resolve().parents[2]


def _declared_floors() -> dict[str, tuple[int, ...]]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    floors = {}
    for line in config["options"]["install_requires"].strip().splitlines():
        match = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?.*>=([0-9.]+)", line.strip())
        if match:
            floors[match.group(1).lower()] = parse_version(match.group(2))
    return floors


def test_the_floors_checked_at_start_are_the_floors_setup_cfg_declares():
    declared = {name: floor for name, floor in _declared_floors().items() if name != "requests"}
    assert {name: floor + (0,) * (3 - len(floor)) for name, floor in declared.items()} == {
        name: floor + (0,) * (3 - len(floor)) for name, floor in FLOORS.items()
    }


def test_the_installed_versions_meet_every_floor():
    assert below_floor() == []


def test_an_older_celery_stops_install_with_the_package_and_the_version_it_needs(monkeypatch):
    installed = {"celery": "5.3.0", "kombu": "5.3.4", "amqp": "5.4.0", "redis": "5.0.0"}
    monkeypatch.setattr(versions.metadata, "version", lambda name: installed.get(name, "99"))
    with pytest.raises(ImproperlyConfigured) as caught:
        celery_beetle.install(Celery(set_as_current=False))
    message = str(caught.value)
    assert "celery 5.3.0 is installed, beetle needs celery>=5.3.6" in message
    assert "kombu" not in message, "only what is below its floor is named"


@pytest.mark.parametrize(
    ("text", "parsed"), [("5.3.6", (5, 3, 6)), ("5.0.0rc1", (5, 0, 0)), ("13", (13,))]
)
def test_a_version_is_read_as_its_release_numbers(text, parsed):
    assert parse_version(text) == parsed
