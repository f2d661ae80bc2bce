"""The example Grafana dashboard's panels, asked of a real Prometheus and drawn with matplotlib.

Grafana is not needed to check a dashboard: every panel is PromQL, so each target is sent to
Prometheus's ``/api/v1/query_range`` (with Grafana's ``$__rate_interval`` replaced by a
window fit for the scrape interval), an error or an empty answer is reported, and the
answers are drawn as the panels would show them (``docs/dashboard.png``).
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana-dashboard.json"


@dataclass
class Series:
    legend: str
    times: list[float]
    values: list[float]


@dataclass
class Panel:
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def load(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = json.loads(path.read_text())["panels"]
    return panels


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def query_range(
    prometheus: str, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{query}", timeout=10) as r:
        answer = json.loads(r.read())
    if answer.get("status") != "success":
        raise RuntimeError(f"{expr}: {answer.get('error')}")
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def ask(
    prometheus: str, start: float, end: float, *, step: float = 1.0, rate_interval: str = "5s"
) -> list[Panel]:
    """Every panel of the dashboard, answered by ``prometheus`` over ``[start, end]``."""
    panels = []
    for spec in load():
        panel = Panel(spec["title"], spec["fieldConfig"]["defaults"].get("unit", ""))
        for target in spec["targets"]:
            expr = target["expr"].replace("$__rate_interval", rate_interval)
            try:
                result = query_range(prometheus, expr, start, end, step)
            except Exception as exc:
                panel.errors.append(f"{expr}: {exc}")
                continue
            for item in result:
                points = [(float(t), float(v)) for t, v in item["values"] if v not in ("NaN",)]
                panel.series.append(
                    Series(
                        legend(target.get("legendFormat", ""), item["metric"]),
                        [t - start for t, _ in points],
                        [v for _, v in points],
                    )
                )
        panels.append(panel)
    return panels


def render(panels: list[Panel], out: Path, *, title: str = "", columns: int = 2) -> None:
    """Draw ``panels`` in a grid, as Grafana lays the dashboard out, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(7 * columns, 2.6 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for series in panel.series:
            ax.plot(series.times, series.values, label=series.legend or panel.title, lw=1.4)
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if panel.series:
            ax.legend(fontsize=7, loc="upper left", ncol=2)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
