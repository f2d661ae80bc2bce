"""The ``beetle-settings`` directive: the settings reference, drawn from the code.

Renders one table row per setting of :data:`celery_beetle.settings.APP_SETTINGS` (the one
table the censor reads too): its name, the task option that overrides it
(:data:`~celery_beetle.settings.TASK_OPTIONS`), its default (the :class:`BeetleSettings`
field's, or :data:`~celery_beetle.settings.SETTING_DEFAULTS_SHOWN`), whether Celery's reports
censor it, and its line of :data:`~celery_beetle.settings.SETTING_DOCS`. A setting added to
``APP_SETTINGS`` appears here by itself; one without a doc line or a default to show is a
warning, which fails the ``-W`` build.

In a Markdown page::

    ```{beetle-settings}
    ```
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

HEADERS = ("setting (app.conf)", "default", "meaning")
WIDTHS = (30, 16, 54)

_UNITS = (
    (86_400, "day", "days"),
    (3_600, "h", "h"),
)


def show_default(field_name: str, value: Any) -> str:
    """A BeetleSettings field default as the docs show it: units, no Python reprs."""
    if value is None:
        return "off"
    if isinstance(value, tuple) and all(isinstance(v, type) for v in value):
        return ", ".join(f"`{v.__name__}`" for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"`{value}`" if isinstance(value, str) else str(value)
    number = str(int(value)) if value == int(value) else str(value)
    if field_name.endswith("_s"):
        for size, one, many in _UNITS:
            if value >= size and value % size == 0:
                count = int(value // size)
                return f"{number} s ({count} {one if count == 1 else many})"
        return f"{number} s"
    if field_name.endswith("_bytes") and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{number} ({value >> 20} MiB)"
    return number


def settings_rows() -> tuple[list[tuple[str, str, str, bool, str]], list[str]]:
    """(name, task option, default, secret, doc) per setting, and what is missing."""
    from celery_beetle import settings as s

    fields = {f.name: f for f in dataclasses.fields(s.BeetleSettings)}
    option_of = {f"beetle_default_{name}": name for name in s.TASK_OPTIONS}
    option_of.update({f"beetle_default_{old}": old for old in s.DEPRECATED_OPTIONS})
    rows, missing = [], []
    for name in s.APP_SETTINGS:  # the table's order: the gate's, then the outbox's, ...
        secret = s.APP_SETTINGS[name]
        doc = s.SETTING_DOCS.get(name)
        if doc is None:
            missing.append(f"{name}: no line in celery_beetle.settings.SETTING_DOCS")
            doc = ""
        default = s.SETTING_DEFAULTS_SHOWN.get(name)
        if default is None:
            field = fields.get(s._APP_OPTIONS.get(name, ""))
            if field is not None and field.default is not dataclasses.MISSING:
                default = show_default(field.name, field.default)
        if default is None:
            missing.append(f"{name}: no default to show (SETTING_DEFAULTS_SHOWN)")
            default = ""
        rows.append((name, option_of.get(name, ""), default, secret, doc))
    return rows, missing


def inline(text: str) -> list[nodes.Node]:
    """Text with `code` spans as docutils nodes (the doc lines' one piece of markup)."""
    parts = re.split(r"`([^`]+)`", text)
    return [
        nodes.literal(part, part) if i % 2 else nodes.Text(part)
        for i, part in enumerate(parts)
        if part
    ]


def _cell(*paragraphs: list[nodes.Node]) -> nodes.entry:
    return nodes.entry("", *(nodes.paragraph("", "", *children) for children in paragraphs))


def _setting_cell(name: str, option: str, secret: bool) -> nodes.entry:
    """The name; below it the per-task option that overrides it, and whether it is secret."""
    notes: list[nodes.Node] = []
    if option:
        notes += [nodes.Text("per task: "), nodes.literal(option, option)]
    if secret:
        notes += [nodes.Text("; " if notes else ""), nodes.strong("secret", "secret")]
    paragraphs = [[nodes.literal(name, name)]]
    if notes:
        paragraphs.append([node for node in notes if node.astext()])
    return _cell(*paragraphs)


class BeetleSettingsDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(__file__)
        import celery_beetle.settings

        self.env.note_dependency(celery_beetle.settings.__file__)
        rows, missing = settings_rows()
        for problem in missing:
            logger.warning("settings reference: %s", problem, location=self.get_location())
        table = nodes.table(classes=["beetle-settings"])
        group = nodes.tgroup(cols=len(HEADERS))
        table += group
        group.extend(nodes.colspec(colwidth=width) for width in WIDTHS)
        head = nodes.thead()
        head += nodes.row("", *(_cell([nodes.Text(h)]) for h in HEADERS))
        group += head
        body = nodes.tbody()
        for name, option, default, secret, doc in rows:
            body += nodes.row(
                "",
                _setting_cell(name, option, secret),
                _cell(inline(default)),
                _cell(inline(doc)),
            )
        group += body
        return [table]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("beetle-settings", BeetleSettingsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
