"""The shop's test settings for the beetle pytest plugin.

In a project of its own, the ini file is all it takes (and this file is not needed)::

    [pytest]
    beetle_app = beetle_shop.app:app
    pythonpath = .          # unless the project is installed: the tests import beetle_shop

(checked: a copy of this directory with that ini and without this file passes on its own).

Here the example runs inside kombu-beetle's own suite, whose rootdir and ini are the
repository's, so the app's path and the project directory the worker runs in are given as
fixtures instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))  # what rootdir would be in the shop's own checkout


@pytest.fixture
def beetle_app_path() -> str:
    return "beetle_shop.app:app"


@pytest.fixture
def beetle_worker_options() -> dict[str, Any]:
    return {"root": PROJECT}
