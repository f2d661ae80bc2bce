"""The documentation's examples run, and its links lead somewhere.

Pages: ``README.md`` and every ``docs/**/*.md`` (the Sphinx site, MyST Markdown).

Runnable examples: a fenced ```` ```python ```` block whose fence is preceded by the line
``<!-- runnable -->`` (blank lines in between allowed) is executed, each in a subprocess of its
own with a timeout, from an empty directory. Mark only examples that need no broker, Redis or
database (URL parsing, settings, censoring, message ids, task declarations); an example fails
when it raises, so it ``assert``s what it shows. ``docs/contributing.md`` says the same for
writers.

Links: every relative link or image target (``[text](path)``, ``![alt](path)``) must name a
file that exists, relative to the page; a ``#anchor`` must be the GitHub-style anchor of one of
the target page's headings (the anchors MyST makes too, ``myst_heading_anchors``), so a link
works on GitHub and in the site alike.

The settings reference is generated from ``celery_beetle.settings``: every setting of
``APP_SETTINGS`` needs its line in ``SETTING_DOCS`` (the Sphinx build fails too without it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from celery_beetle.settings import APP_SETTINGS, SETTING_DEFAULTS_SHOWN, SETTING_DOCS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKER = "<!-- runnable -->"
TIMEOUT_S = 60
#: the README keeps what the project is, the two commands, the quickstart and links (#27)
README_MAX_LINES = 200

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    found = [ROOT / "README.md"]
    found += sorted(
        path
        for path in DOCS.rglob("*.md")
        if not {"_build", "_screenshots"} & set(path.relative_to(DOCS).parts)
    )
    return found


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    info: str
    code: str
    marked: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse(path: Path) -> tuple[list[Block], list[tuple[int, str]], list[int]]:
    """The page's fenced blocks, its lines outside them (number, text), and the line numbers
    of runnable markers that no fence follows."""
    blocks: list[Block] = []
    prose: list[tuple[int, str]] = []
    stray: list[int] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    marker_at: int | None = None
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            text = lines[i]
            if text.strip() == MARKER:
                if marker_at is not None:
                    stray.append(marker_at)
                marker_at = i + 1
            elif text.strip():
                if marker_at is not None:
                    stray.append(marker_at)
                    marker_at = None
                prose.append((i + 1, text))
            i += 1
            continue
        fence, info = opening.group(1), opening.group(2).lower()
        start, body = i, []
        i += 1
        while i < len(lines):
            closing = re.match(r"^ {0,3}(`{3,}|~{3,})\s*$", lines[i])
            if closing and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= len(fence):
                break
            body.append(lines[i])
            i += 1
        blocks.append(Block(path, start + 1, info, "\n".join(body) + "\n", marker_at is not None))
        marker_at = None
        i += 1
    if marker_at is not None:
        stray.append(marker_at)
    return blocks, prose, stray


def runnable_blocks() -> list[Block]:
    return [block for path in pages() for block in parse(path)[0] if block.marked]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (MyST's default slug function agrees)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, text in parse(path)[1]:
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", text)
        if not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, text in parse(path)[1]:
        text = _CODE_SPAN.sub("", text)
        found += [(number, match.group(1)) for match in _LINK.finditer(text)]
    return found


# -- runnable examples -------------------------------------------------------------------------


def test_there_are_runnable_examples_and_each_marker_marks_a_python_block() -> None:
    blocks = runnable_blocks()
    assert len(blocks) >= 3, [block.where for block in blocks]
    assert {"python"} == {block.info for block in blocks}, [
        f"{block.where}: a runnable block must be ```python, not {block.info!r}"
        for block in blocks
        if block.info != "python"
    ]
    stray = [f"{path.relative_to(ROOT)}:{line}" for path in pages() for line in parse(path)[2]]
    assert not stray, f"{MARKER} not followed by a fenced block: {stray}"


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda block: block.where)
def test_runnable_example_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code, encoding="utf-8")
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: still running after {TIMEOUT_S} s")
    assert done.returncode == 0, f"{block.where} failed:\n{done.stderr}"


# -- links -------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_lead_to_files_and_headings(page: Path) -> None:
    broken = []
    for number, target in links(page):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # another site: not checked (no network here)
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"line {number}: {target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"line {number}: {target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_link_checker_sees_links_and_anchors() -> None:
    """The checker itself: it finds the README's links into docs/ and the headings' anchors."""
    readme_links = {target for _, target in links(ROOT / "README.md")}
    assert "docs/guides/exactly-once.md#rules-that-hold-at-the-defaults" in readme_links
    assert "docs/guides/fault-explorer.md#findings" in readme_links
    assert slug("Status: `beetle status`") == "status-beetle-status"
    assert slug("Wake-ups: polling, or LISTEN/NOTIFY") == "wake-ups-polling-or-listennotify"
    assert "per-key-ordering" in anchors(DOCS / "guides" / "outbox.md")


def test_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, "move the detail into docs/ and link to it"


# -- the settings reference --------------------------------------------------------------------


def test_every_setting_has_a_line_in_the_settings_reference() -> None:
    assert set(SETTING_DOCS) == set(APP_SETTINGS)
    assert all(doc.strip() for doc in SETTING_DOCS.values())
    assert set(SETTING_DEFAULTS_SHOWN) <= set(APP_SETTINGS)


def test_the_defaults_shown_for_settings_read_elsewhere_are_the_code_s() -> None:
    from celery_beetle.ops.management import ManagementConfig
    from celery_beetle.ops.worker import DEFAULT_INTERVAL_S

    assert SETTING_DEFAULTS_SHOWN["beetle_policy_interval"] == f"{DEFAULT_INTERVAL_S:g} s"
    assert f"port {ManagementConfig().port}" in SETTING_DEFAULTS_SHOWN["beetle_management"]
