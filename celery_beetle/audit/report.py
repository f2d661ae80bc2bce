"""The audit's HTML report: one self-contained file a person can open or attach to a ticket.

Plots are rendered with matplotlib's Agg backend to PNG and embedded as base64 ``data:`` URIs,
so the report needs no server, no JavaScript and no files next to it. It is rendered from the
summary dictionary alone (what ``summary.json`` holds), never from Spark, so it can be rebuilt
from an old ``summary.json``: ``python -m celery_beetle.audit.report summary.json``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

from celery_beetle.audit.schema import BAD_VERDICTS, VERDICTS

__all__ = ["render", "warm_up"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{margin-bottom:.2em} .ok{color:#1a7f37} .bad{color:#cf222e}
table{border-collapse:collapse;margin:.5em 0 1.5em} td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#f4f4f4} td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%} code{font-size:90%}
"""
_EXTRA = ("retried_messages", "retries", "completed_unobserved")
_COLOURS = {"completed_once": "#2da44e", "dead_lettered": "#9a6700", "expired": "#8c959f"}


def warm_up() -> None:
    """Import matplotlib now (about a second); the audit calls this on a thread as Spark works."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _bar(
    labels: Sequence[str], values: Sequence[float], title: str, colours: Sequence[str] | None = None
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, max(1.6, 0.35 * len(labels) + 0.8)))
    ax.barh(list(labels), list(values), color=list(colours) if colours else "#0969da")
    ax.invert_yaxis()
    ax.set_title(title)
    if values and max(values) > 0 and max(values) > 1000 * max(min(v for v in values if v) or 1, 1):
        ax.set_xscale("log")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    return _png(fig)


def _grouped(rows: list[dict[str, Any]], spans: Sequence[str], pct: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['task_name']} [{r['queue']}]" for r in rows]
    fig, ax = plt.subplots(figsize=(8, max(1.8, 0.5 * len(rows) + 1)))
    height = 0.8 / max(1, len(spans))
    for k, span in enumerate(spans):
        ys = [i + k * height for i in range(len(rows))]
        ax.barh(ys, [r.get(f"{span}_{pct}_ms") or 0 for r in rows], height, label=span)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))], labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _png(fig)


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            num = isinstance(v, int | float)
            text = f"{v:,}" if isinstance(v, int) else ("" if v is None else str(v))
            cells.append(f"<td{' class=n' if num else ''}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _timeline(timeline: dict[str, Any]) -> str:
    """Published, started and completed messages per second, a line per broker, one panel
    per event, sharing the time axis: a stall after a fault and the recovery line up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = float(timeline.get("bucket_s") or 1)
    series: dict[tuple[str, str], dict[int, float]] = {}
    last = 0
    for row in timeline.get("rows") or []:
        key = (str(row["event"]), str(row["broker"]))
        series.setdefault(key, {})[int(row["bucket"])] = row["messages"] / width
        last = max(last, int(row["bucket"]))
    events = ("published", "started", "completed")
    fig, axes = plt.subplots(len(events), 1, figsize=(9, 6.5), sharex=True)
    xs = list(range(last + 1))
    for ax, event in zip(axes, events, strict=True):
        for (kind, broker), points in sorted(series.items()):
            if kind == event:
                ys = [points.get(x, 0.0) for x in xs]
                ax.plot([x * width for x in xs], ys, label=series_label(broker))
        ax.set_ylabel(f"{event}/s")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper right", title="broker", title_fontsize=8)
    axes[-1].set_xlabel("seconds from the first publish")
    axes[0].set_title("messages per second over the run, per broker")
    return _png(fig)


#: the timeline's broker for events that name none (a run's ``started`` and ``completed``
#: come from a worker, whichever broker's copy it ran)
NO_BROKER = "?"


def series_label(broker: str) -> str:
    """The legend of one timeline series: the broker, or what a series without one is."""
    if broker in (NO_BROKER, "", "None"):
        return "all brokers (the event names none)"
    return broker


def _img(src: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="{src}">'


def render(summary: dict[str, Any]) -> str:
    """The whole report as one HTML string."""
    ok = bool(summary.get("ok", not any(summary.get(v) for v in BAD_VERDICTS)))
    verdicts = [v for v in VERDICTS if v in summary]
    counts = [summary[v] for v in verdicts]
    colours = [("#cf222e" if v in BAD_VERDICTS else _COLOURS.get(v, "#57606a")) for v in verdicts]
    parts = [
        "<!doctype html><html><head><meta charset=utf-8><title>beetle audit</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>beetle delivery audit</h1>",
        f"<p class={'ok' if ok else 'bad'}><b>{'PASS' if ok else 'FAIL'}</b>: "
        f"{summary.get('messages', 0):,} messages; lost {summary.get('lost', 0):,}, "
        f"duplicated {summary.get('duplicated', 0):,}, unexpected "
        f"{summary.get('unexpected', 0):,}; {summary.get('malformed_lines', 0):,} malformed "
        "lines.</p>",
        f"<p>Trace: <code>{html.escape(str(summary.get('trace_path', '')))}</code>; overlap "
        f"tolerance {summary.get('skew_tolerance_ms', '?')} ms; audit took "
        f"{summary.get('elapsed_s', '?')} s.</p>",
        "<h2>Verdicts</h2>",
        _table(
            [{"verdict": v, "messages": c} for v, c in zip(verdicts, counts, strict=False)],
            ["verdict", "messages"],
        ),
        _img(_bar(verdicts, counts, "messages per verdict", colours), "verdict counts"),
        "<h2>Retries and unobserved completions</h2>",
        _table([{k: summary.get(k, 0) for k in _EXTRA}], list(_EXTRA)),
    ]
    timeline = summary.get("timeline") or {}
    if timeline.get("rows"):
        parts += [
            "<h2>Over time</h2>",
            "<p>Messages first published (per broker holding a copy), first started and first "
            "completed (per broker of the copy that ran), per "
            f"{timeline.get('bucket_s', 1)} s.</p>",
            _img(_timeline(timeline), "published, started and completed per second"),
        ]
    lat = summary.get("latency_by_task") or []
    if lat:
        spans = ("publish_to_start", "start_to_complete", "publish_to_complete")
        parts += ["<h2>Latency (completed messages)</h2>"]
        overall = summary.get("latency_ms") or {}
        parts.append(
            _table(
                [{"span": s, **overall.get(s, {})} for s in spans], ["span", "p50", "p90", "p99"]
            )
        )
        for pct in ("p50", "p99"):
            parts.append(_img(_grouped(lat, spans, pct, f"{pct} latency per task and queue"), pct))
        cols = ["task_name", "queue", "completed"] + [
            f"{s}_{p}_ms" for s in spans for p in ("p50", "p90", "p99")
        ]
        parts.append(_table(lat, cols))
    brokers = summary.get("brokers") or []
    if brokers:
        parts += [
            "<h2>Brokers</h2>",
            _table(brokers, ["broker", "published_messages", "deliveries"]),
            _img(
                _bar(
                    [str(b["broker"]) for b in brokers],
                    [b.get("deliveries") or 0 for b in brokers],
                    "deliveries per broker",
                ),
                "deliveries per broker",
            ),
        ]
    red = summary.get("redundancy") or {}
    if red:
        parts += ["<h2>Redundancy coverage</h2>", _table([red], list(red))]
        if red.get("redundant_messages"):
            two = red.get("on_two_or_more_brokers", 0)
            labels = ["on ≥2 brokers", "on 1 broker"]
            values = [two, red["redundant_messages"] - two]
            parts.append(_img(_bar(labels, values, "redundant messages"), "redundancy"))
    parts.append("<h2>Samples of each bad class</h2>")
    for cls, ids in (summary.get("samples") or {}).items():
        items = (
            "".join(f"<li><code>{html.escape(str(i))}</code></li>" for i in ids) or "<li>none</li>"
        )
        parts.append(f"<h3>{html.escape(cls)}</h3><ul>{items}</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Rebuild ``report.html`` from a ``summary.json``: ``report.py SUMMARY [OUT]``."""
    args = sys.argv[1:] if argv is None else argv
    with open(args[0], encoding="utf-8") as f:
        summary = json.load(f)
    out = args[1] if len(args) > 1 else args[0].replace("summary.json", "report.html")
    with open(out, "w", encoding="utf-8") as f:
        f.write(render(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
