"""``beetle status --watch``: a live view of brokers, queues, the dedup store and the workers.

Every second it asks each broker and the store what ``beetle status`` asks
(:mod:`celery_beetle.cli.report`: up or down, ready messages and consumers per queue and broker)
and, given workers' metrics endpoints (``--metrics http://worker:9808/metrics``), scrapes
them and shows what the gates decided per second (run, duplicate, deferred, expired, ...),
tasks started and completed per second, and the dead letters per queue since the workers
started. Rates are the difference between two scrapes, as Prometheus's ``rate()`` would be.
"""

from __future__ import annotations

import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_beetle.cli import report

__all__ = ["Snapshot", "scrape", "view", "watch"]

Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(url: str, timeout: float = 2.0) -> dict[Sample, float]:
    """One metrics endpoint's samples: ``{(name, sorted labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _by(samples: Mapping[Sample, float], name: str, label: str) -> dict[str, float]:
    found: dict[str, float] = defaultdict(float)
    for (sample, labels), value in samples.items():
        if sample == name:
            found[dict(labels).get(label, "")] += value
    return dict(found)


@dataclass
class Snapshot:
    """What the view shows at one moment."""

    at: float
    brokers: list[report.BrokerStatus]
    store: report.StoreStatus | None = None
    #: summed over every metrics endpoint that answered
    samples: dict[Sample, float] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)

    def totals(self, name: str, label: str) -> dict[str, float]:
        return _by(self.samples, name, label)


def take(
    broker_url: str,
    redis_url: str | None,
    queues: Iterable[str],
    metrics_urls: Iterable[str],
    clock: Callable[[], float] = time.monotonic,
) -> Snapshot:
    snapshot = Snapshot(clock(), report.brokers(broker_url, queues))
    if redis_url:
        snapshot.store = report.store(redis_url)
    summed: dict[Sample, float] = defaultdict(float)
    for url in metrics_urls:
        try:
            for key, value in scrape(url).items():
                summed[key] += value
        except Exception as exc:
            snapshot.unreachable.append(f"{url}: {type(exc).__name__}")
    snapshot.samples = dict(summed)
    return snapshot


def rates(now: Snapshot, before: Snapshot | None, name: str, label: str) -> dict[str, float]:
    """Per second between two snapshots (a counter that went down: a worker restarted)."""
    totals = now.totals(name, label)
    if before is None or now.at <= before.at:
        return dict.fromkeys(totals, 0.0)
    earlier = before.totals(name, label)
    seconds = now.at - before.at
    return {k: max(v - earlier.get(k, 0.0), 0.0) / seconds for k, v in totals.items()}


def view(now: Snapshot, before: Snapshot | None, queues: Iterable[str]) -> Any:
    """The rich renderable of one refresh."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    queues = list(queues)
    parts: list[Any] = []
    brokers = Table(title="brokers", title_justify="left")
    # names, errors and metric labels come from outside: escaped, so that rich shows
    # their brackets rather than reading them as markup
    for column in ("broker", "state", *(f"{q} ready/consumers" for q in queues)):
        brokers.add_column(escape(column))
    for b in now.brokers:
        state = "[green]up[/]" if b.up else f"[red]down[/] {escape(b.error or '')}"
        cells = [
            "-" if depth is None else f"{depth[0]}/{depth[1]}"
            for depth in (b.queues.get(q) for q in queues)
        ]
        brokers.add_row(escape(b.name), state, *cells)
    parts.append(brokers)
    if now.store is not None:
        s = now.store
        line = (
            f"dedup store {escape(s.url)}: [green]up[/], {s.latency_ms} ms, {s.keys} keys"
            if s.up
            else f"dedup store {escape(s.url)}: [red]down[/] {escape(str(s.error))}"
        )
        parts.append(Text.from_markup(line))
    if now.samples:
        verdicts = rates(now, before, "beetle_gate_deliveries_total", "verdict")
        gate = Table(title="gate verdicts (copies/s)", title_justify="left")
        shown = [
            v for v in sorted(verdicts) if now.totals("beetle_gate_deliveries_total", "verdict")[v]
        ]
        for verdict in shown:
            gate.add_column(escape(verdict), justify="right")
        gate.add_row(*(f"{verdicts[v]:.1f}" for v in shown))
        parts.append(gate)
        tasks = Table(title="tasks (per s)", title_justify="left")
        row = []
        for event in ("started", "completed", "failed", "retried"):
            tasks.add_column(event, justify="right")
            per_s = rates(now, before, f"beetle_task_{event}_total", "task")
            row.append(f"{sum(per_s.values()):.1f}")
        tasks.add_row(*row)
        parts.append(tasks)
        dead = now.totals("beetle_dead_letters_total", "queue")
        dead_table = Table(title="dead letters since the workers started", title_justify="left")
        dead_table.add_column("queue")
        dead_table.add_column("dead letters", justify="right")
        for queue, n in sorted(dead.items()):
            style = "red" if n else ""
            dead_table.add_row(escape(queue), f"[{style}]{n:.0f}[/]" if style else f"{n:.0f}")
        parts.append(dead_table)
    for problem in now.unreachable:
        parts.append(Text(f"metrics unreachable: {problem}", style="yellow"))
    return Group(*parts)


def watch(
    broker_url: str,
    redis_url: str | None,
    queues: Iterable[str],
    metrics_urls: Iterable[str],
    *,
    interval_s: float = 1.0,
    refreshes: int | None = None,
    console: Any = None,
) -> None:
    """Refresh the view every ``interval_s`` until interrupted (or ``refreshes`` times)."""
    from rich.live import Live

    queues, metrics_urls = list(queues), list(metrics_urls)
    before: Snapshot | None = None
    done = 0
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while refreshes is None or done < refreshes:
            started = time.monotonic()
            now = take(broker_url, redis_url, queues, metrics_urls)
            live.update(view(now, before, queues), refresh=True)
            before = now
            done += 1
            if refreshes is not None and done >= refreshes:
                break
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
