"""The soak as a page: one HTML file a person opens to read a long run at a glance.

``scripts/explore --soak`` (and ``--seeds N``) writes it beside its table, and again after
every scenario, so a soak still running can be looked at. The page holds three charts (PNG,
embedded: the file travels alone) and the failures: the scenarios over time, each a dot at
the minute it ended (green passed, red failed); the faults injected per kind; the messages
judged, summed over time. A table counts the scenarios that drew each newer kind (the
marks of :mod:`.coverage`). Each failing seed comes with its replay command, its regression
test when one was written, the rules it broke and the story of its first violating
message: what the checker knows of it, then its trace, ledger and log lines in time order.
"""

from __future__ import annotations

import base64
import html
import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from celery_beetle.testing.explorer.coverage import MARKS

__all__ = ["Row", "write_report"]

PASS, FAIL = "#2e7d32", "#c62828"


@dataclass(frozen=True)
class Row:
    """One scenario of the soak, as the page shows it."""

    seed: int
    ended_at: float  # unix seconds
    elapsed_s: float
    messages: int
    faults: dict[str, int] = field(default_factory=dict)
    violations: tuple[str, ...] = ()
    findings: tuple[str, ...] = ()
    #: the first violating message's story (empty for a scenario that passed)
    story: tuple[str, ...] = ()
    replay: str = ""
    regression_test: str = ""
    describe: str = ""
    #: the newer kinds its scenario drew (:func:`.coverage.marks`)
    marks: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return bool(self.violations)


def write_report(path: Path, rows: Sequence[Row], started_at: float) -> Path:
    """Write the page of ``rows`` (a soak begun at ``started_at``, unix seconds) to
    ``path``; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_page(rows, started_at))
    return path


def _page(rows: Sequence[Row], started_at: float) -> str:
    failing = [r for r in rows if r.failed]
    faults: Counter[str] = Counter()
    for r in rows:
        faults.update(r.faults)
    minutes = (max((r.ended_at for r in rows), default=started_at) - started_at) / 60
    begun = datetime.fromtimestamp(started_at, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    verdict = (
        f'<p class="bad">{len(failing)} of {len(rows)} scenarios failed</p>'
        if failing
        else f'<p class="good">{_passed(len(rows))}</p>'
    )
    seeds = [r.seed for r in rows]
    totals = [
        ("scenarios run", len(rows)),
        ("seeds", f"{min(seeds)} … {max(seeds)}" if seeds else "-"),
        ("messages judged", sum(r.messages for r in rows)),
        ("faults injected", sum(faults.values())),
        ("failing scenarios", len(failing)),
        ("minutes", f"{minutes:.1f}"),
    ]
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            "<title>fault explorer soak</title>",
            f"<style>{_STYLE}</style></head><body>",
            f"<h1>Fault explorer soak <small>from {html.escape(begun)}</small></h1>",
            verdict,
            _table(["what", "count"], [[k, str(v)] for k, v in totals]),
            '<div class="charts">',
            _img(_over_time(rows, started_at), "scenarios over time"),
            _img(_faults_chart(faults), "faults per kind"),
            _img(_messages_chart(rows, started_at), "messages judged"),
            "</div>",
            _drawn(rows),
            _failures(failing),
            "</body></html>",
        ]
    )


def _passed(n: int) -> str:
    return "the scenario passed" if n == 1 else f"all {n} scenarios passed"


def _drawn(rows: Sequence[Row]) -> str:
    counts = Counter(m for r in rows for m in r.marks)
    body = [[mark, str(counts[mark])] for mark in MARKS]
    return "<h2>Newer kinds drawn</h2>" + _table(["kind", "scenarios"], body)


def _failures(failing: Sequence[Row]) -> str:
    if not failing:
        return "<h2>Failures</h2><p>none</p>"
    parts = [f"<h2>Failures ({len(failing)})</h2>"]
    for r in failing:
        parts.append(f'<section class="failure" id="seed-{r.seed}">')
        parts.append(f"<h3>seed {r.seed}</h3>")
        parts.append(f"<p>replay: <code>{html.escape(r.replay)}</code></p>")
        if r.regression_test:
            parts.append(f"<p>regression test: <code>{html.escape(r.regression_test)}</code></p>")
        if r.findings:
            parts.append(f"<p>looks like: {html.escape('; '.join(r.findings))}</p>")
        if r.describe:
            parts.append(f'<p class="scenario">{html.escape(r.describe)}</p>')
        shown = r.violations[:8]
        more = len(r.violations) - len(shown)
        items = "".join(f"<li><code>{html.escape(v)}</code></li>" for v in shown)
        tail = f"<li>… {more} more (verdict.json)</li>" if more > 0 else ""
        parts.append(f"<p>violations ({len(r.violations)}):</p><ul>{items}{tail}</ul>")
        parts.append("<p>the first violating message's story:</p>")
        parts.append(f"<pre>{html.escape(chr(10).join(r.story) or '(nothing known)')}</pre>")
        parts.append("</section>")
    return "\n".join(parts)


def _table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode()
    return f'<figure><img alt="{alt}" src="data:image/png;base64,{data}"></figure>'


# -- charts (matplotlib, drawn off screen) ------------------------------------------------------


def _figure(title: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax


def _png(fig: Any) -> bytes:
    from matplotlib import pyplot as plt

    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def _whole() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _over_time(rows: Sequence[Row], started_at: float) -> bytes:
    fig, ax = _figure("scenarios over time")
    for failed, colour, label in ((False, PASS, "passed"), (True, FAIL, "failed")):
        picked = [r for r in rows if r.failed is failed]
        ax.scatter(
            [(r.ended_at - started_at) / 60 for r in picked],
            [r.elapsed_s for r in picked],
            c=colour,
            s=36 if failed else 16,
            marker="x" if failed else "o",
            label=f"{label} ({len(picked)})",
        )
    for r in rows:
        if r.failed:
            ax.annotate(str(r.seed), ((r.ended_at - started_at) / 60, r.elapsed_s), fontsize=7)
    ax.set_xlabel("minutes into the soak (when the scenario ended)")
    ax.set_ylabel("scenario's run time (s)")
    last = max(((r.ended_at - started_at) / 60 for r in rows), default=1.0)
    ax.set_xlim(0, last * 1.1 or 1.0)  # room for the last seed's label
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    return _png(fig)


def _faults_chart(faults: Counter[str]) -> bytes:
    fig, ax = _figure("faults injected per kind")
    kinds = sorted(faults, key=lambda k: (faults[k], k))
    if kinds:
        ax.barh(kinds, [faults[k] for k in kinds], color="#546e7a")
        for y, kind in enumerate(kinds):
            ax.annotate(
                str(faults[kind]),
                (faults[kind], y),
                xytext=(3, -3),
                fontsize=7,
                textcoords="offset points",
            )
    else:
        ax.text(0.5, 0.5, "no faults", ha="center", va="center", transform=ax.transAxes)
    ax.tick_params(axis="y", labelsize=7)
    ax.xaxis.set_major_locator(_whole())
    ax.set_xlabel("times injected")
    return _png(fig)


def _messages_chart(rows: Sequence[Row], started_at: float) -> bytes:
    fig, ax = _figure("messages judged")
    ordered = sorted(rows, key=lambda r: r.ended_at)
    x = [0.0] + [(r.ended_at - started_at) / 60 for r in ordered]
    total, y = 0, [0]
    for r in ordered:
        total += r.messages
        y.append(total)
    ax.step(x, y, where="post", color="#1565c0")
    for r in ordered:
        if r.failed:
            ax.axvline((r.ended_at - started_at) / 60, color=FAIL, alpha=0.4, lw=1)
    ax.set_xlabel("minutes into the soak (red: a failing scenario ended)")
    ax.set_ylabel("messages judged, in all")
    ax.yaxis.set_major_locator(_whole())
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    return _png(fig)


_STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1250px; color: #222; }
h1 small { font-weight: normal; color: #666; font-size: 55%; }
.good { color: #2e7d32; font-weight: bold; font-size: 120%; }
.bad { color: #c62828; font-weight: bold; font-size: 120%; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
td, th { border: 1px solid #ccc; padding: 3px 10px; text-align: left; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; }
figure { margin: 0; }
figure img { width: 600px; border: 1px solid #ddd; }
.failure { border-left: 4px solid #c62828; padding-left: 12px; margin: 1.2em 0; }
.scenario { color: #555; font-size: 85%; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
code { background: #f0f0f0; padding: 1px 4px; }
"""
