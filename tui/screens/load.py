"""Step 2: does the load arrive as asked, and does the engine keep up? Offered against
planned and target over time, lateness and client waits, in flight and the engine's
queue, and the numbers of the load checks (back-pressure, Little's law, saturation)."""

from __future__ import annotations

import numpy as np
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Label, Static

from .. import fmt
from ..data_load import load_series
from ..widgets.charts import Chart, columns
from .checks import TriageStepScreen


def series_chart(label: str, values, unit: str, reference: float | None = None,
                 height: int = 4, style: str = "cyan"):  # fmt: skip
    finite = np.asarray(values, dtype=float)
    finite = finite[~np.isnan(finite)]
    peak = float(finite.max()) if len(finite) else float("nan")

    def draw(width: int) -> Text:
        head = Text(f"{label}  ", style="bold")
        head.append(f"max {fmt.num(peak)} {unit}", style="dim")
        if reference:
            head.append(f" · ┄ target {fmt.num(reference)} {unit}", style="yellow")
        return head + Text("\n") + columns(list(values), width, height, reference, style)

    return Chart(draw, classes="series")


class LoadScreen(TriageStepScreen):
    step = 2

    def evidence(self) -> ComposeResult:
        s = self.data.memo("load_series", load_series)
        load = self.data.get("load")
        if s is None or load is None:
            yield Label(f"no load analysis: {self.data.missing_reason('load') or 'too few sends'}",
                        classes="note")  # fmt: skip
            return
        span = f"{fmt.duration(s.t0_s)} → {fmt.duration(s.t0_s + s.bin_s * len(s.offered))}"
        yield Label(f"Over the sending period ({span}, {fmt.duration(s.bin_s)} per column)",
                    classes="section")  # fmt: skip
        yield series_chart("offered req/s", s.offered, "req/s", s.target_rps)
        if not np.isnan(s.planned).all():
            yield series_chart("planned req/s (the client's schedule)", s.planned, "req/s",
                               s.target_rps, height=3, style="blue")  # fmt: skip
        yield series_chart("worst lateness (created − planned)", s.late_ms, "ms", height=3,
                           style="yellow")  # fmt: skip
        yield series_chart("worst client wait (sent − created)", s.wait_ms, "ms", height=3,
                           style="magenta")  # fmt: skip
        yield series_chart("in flight (client)", s.in_flight, "requests", height=3, style="green")
        if not np.isnan(s.waiting).all():
            yield series_chart("engine waiting queue", s.waiting, "requests", height=3,
                               style="red")  # fmt: skip
        yield Static(numbers(load), id="load-numbers")


def numbers(load) -> Table:
    o, bp, f = load.offered, load.back_pressure, load.in_flight
    ll, sat = load.littles_law, load.saturation
    t = Table("load check", "value", box=None, header_style="bold dim", padding=(0, 1))
    rps = "req/s"
    late = o.lateness_s
    rows = [
        ("mode / target", f"{o.mode or '?'} / {fmt.rate(o.target_rate_rps, rps)}"),
        (
            "planned → issued → offered",
            f"{fmt.rate(o.planned_rate_rps, rps)} → {fmt.rate(o.issued_rate_rps, rps)} → "
            f"{fmt.rate(o.offered_rate_rps, rps)} "
            f"({fmt.pct(o.offered_vs_target)} of target)",
        ),
        ("fell behind its plan", "yes" if o.under_delivered else "no"),
        (
            "lateness p50 / p99 / max",
            f"{fmt.ms(late.p50)} / {fmt.ms(late.p99)} / {fmt.ms(late.max)} "
            f"({fmt.pct(o.late_share)} over 1 ms)",
        ),
        ("concurrency cap", str(bp.concurrency_cap) if bp.concurrency_cap else "none"),
        (
            "client wait p99 / total",
            f"{fmt.ms(bp.client_wait_s.p99)} / {fmt.duration(bp.total_wait_s)}",
        ),
        ("found the cap full", fmt.pct(bp.blocked_share)),
        (
            "in flight mean / peak",
            f"{fmt.num(f.mean)} / {f.peak} (run: {fmt.num(f.mean_run)} / {f.peak_run})",
        ),
        (
            "Little's law λ·W vs L",
            f"{fmt.num(ll.lambda_w)} vs {fmt.num(ll.client_in_flight)} "
            f"({fmt.pct(ll.lambda_w_vs_client)} apart; engine {fmt.num(ll.engine_in_system)})",
        ),
        (
            "arrivals vs completions",
            f"{fmt.rate(sat.arrival_rate_rps, rps)} vs {fmt.rate(sat.completion_rate_rps, rps)}",
        ),
        (
            "engine queue growth",
            f"{fmt.num(sat.queue_growth)} requests over the window"
            f"{' — saturated' if sat.saturated else ''}",
        ),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t
