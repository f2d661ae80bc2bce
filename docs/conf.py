"""Sphinx configuration of the documentation site (MyST Markdown pages under docs/).

Build: ``.venv/bin/sphinx-build -W -q -b html docs docs/_build/html`` (``scripts/test`` runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

project = "kombu-beetle / celery-beetle"
author = "the kombu-beetle authors"
copyright = "the kombu-beetle authors"  # no year: the output does not depend on the date

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "beetle_settings",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_screenshots", "_ext"]

# GitHub-style anchors for headings down to ####, so that `guides/outbox.md#per-key-ordering`
# works on GitHub and in the site alike
myst_heading_anchors = 4

autodoc_member_order = "bysource"
autodoc_typehints = "description"
# BeetleTask overrides Celery attributes whose docstrings use Celery's own roles (:setting:)
autodoc_inherit_docstrings = False
autodoc_default_options = {"show-inheritance": False}

html_theme = "furo"
html_title = "kombu-beetle / celery-beetle"
html_last_updated_fmt = None
html_show_sourcelink = False
html_static_path = ["_static"]
html_css_files = ["beetle.css"]

# "--out" in click's help text stays two hyphens, not an en dash; quotes stay straight
smartquotes = False

# Every cross-reference must resolve (with -W a broken one fails the build)...
nitpicky = True
# ...except to other projects' objects. Intersphinx would link them, but it fetches each
# project's objects.inv over the network, which a build here (and in CI) may not have: the
# names below are the standard library's, kombu's, Celery's, redis-py's, SQLAlchemy's,
# pytest-celery's, pika's and Django's, as type hints and docstrings name them.
nitpick_ignore_regex = [
    (r"py:.*", r"(collections\.abc|os|pathlib|threading|datetime|typing)\..*"),
    (r"py:class", r"Path|Celery"),
    (r"py:.*", r"(kombu|celery|amqp|redis|sqlalchemy|sa|pytest_celery|pika|django)\..*"),
]
