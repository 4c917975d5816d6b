"""The roofline: engine steps (analytic model) and kernels/ops with their own FLOPs and
bytes, as points of attained FLOP/s against arithmetic intensity under the ceilings of
the run's device; the bound classes; the kernels' table. `t` lists the steps, sortable
by their share of the roof."""

from __future__ import annotations

import numpy as np
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Label, Static

from .. import fmt
from ..widgets.charts import Chart, scatter_loglog
from .base import RunScreen

HEIGHT = 12
AXIS_W = 9


def draw_roofline(report, width: int) -> Text:
    c, dtype = report.ceilings, report.dtype
    peak, bw = c.peak_flops(dtype), c.bytes_per_s
    series = []
    if len(report.steps):
        s = report.steps
        series.append(
            ("steps", s["intensity"].to_numpy(), s["attained_flops_per_s"].to_numpy(), "•")
        )
    if len(report.spans):
        k = report.spans
        series.append(("kernels/ops", k["intensity"].to_numpy(),
                       k["attained_flops_per_s"].to_numpy(), "×"))  # fmt: skip
    plot_w = max(width - AXIS_W - 1, 20)
    plot, (x_lo, x_hi, y_lo, y_hi) = scatter_loglog(series, plot_w, HEIGHT,
                                                    lambda x: min(peak, x * bw))  # fmt: skip
    out = Text()
    lines = plot.split("\n")
    labels = {0: y_hi, HEIGHT // 2: (y_hi + y_lo) / 2, HEIGHT - 1: y_lo}  # log10 FLOP/s
    for i, line in enumerate(lines):
        label = fmt.si(10 ** labels[i]) if i in labels else ""
        out.append(label.rjust(AXIS_W - 1) + "│", style="dim")
        out.append_text(line)
        out.append("\n")
    out.append(" " * AXIS_W + "└" + "─" * (plot_w - 1) + "\n", style="dim")
    left, right = f"{fmt.num(10**x_lo)} FLOP/B", f"{fmt.num(10**x_hi)} FLOP/B"
    out.append(" " * AXIS_W + left + right.rjust(plot_w - len(left)) + "\n", style="dim")
    out.append("• steps  ", style="bold cyan")
    out.append("× kernels/ops  ", style="bold magenta")
    out.append("─ roof", style="yellow")
    out.append("  (y: attained FLOP/s, x: arithmetic intensity)", style="dim")
    return out


class RooflineScreen(RunScreen):
    name_text = "roofline"
    needs_analysis = False
    preparing_text = "placing steps and kernels on the roofline…"

    def prepare(self) -> None:
        _ = self.data.roofline

    def body(self) -> ComposeResult:
        r = self.data.roofline
        if not len(r.steps) and not len(r.spans):
            yield Label("nothing to place: no model shape in the run's config and no span "
                        "with FLOPs and bytes", classes="note")  # fmt: skip
            return
        yield Chart(lambda w: draw_roofline(r, w), id="roofline-chart")
        yield Static(ceilings_text(r), id="ceilings")
        yield Static(bound_table(r), id="bounds")
        if len(r.spans):
            yield Static(kernel_table(r.spans), id="roofline-kernels")
        yield Label("t: every step with its share of the roof (sort with s)", classes="note")


def ceilings_text(r) -> Text:
    c, dtype = r.ceilings, r.dtype
    peak, bw = c.peak_flops(dtype), c.bytes_per_s
    return Text(
        f"ceilings: {c.device}, {dtype}: {fmt.si(peak, 'FLOP/s')}, {fmt.si(bw, 'B/s')}; "
        f"ridge {fmt.num(peak / bw)} FLOP/B ({c.kind}: {c.source})",
        style="dim",
    )


def bound_table(r) -> Table:
    t = Table("placed", "count", "compute", "bandwidth", "latency", "median % of roof", box=None,
              header_style="bold dim", padding=(0, 1))  # fmt: skip
    for label, frame, weight in (("steps", r.steps, None), ("kernels/ops", r.spans, "count")):
        if not len(frame):
            continue
        w = frame[weight].to_numpy() if weight else np.ones(len(frame))
        counts = {b: int(w[(frame["bound"] == b).to_numpy()].sum()) for b in
                  ("compute", "bandwidth", "latency")}  # fmt: skip
        t.add_row(label, f"{int(w.sum()):,}", *(f"{counts[b]:,}" for b in counts),
                  fmt.num(float(np.nanmedian(frame["pct_of_roof"])), 3))  # fmt: skip
    return t


def kernel_table(spans) -> Table:
    t = Table("kernel / op", "n", "FLOP/B", "attained", "% roof", "bound", box=None,
              header_style="bold dim", padding=(0, 1))  # fmt: skip
    for k in spans.sort_values("seconds", ascending=False).head(15).itertuples():
        attained = fmt.si(k.attained_flops_per_s, "FLOP/s")
        t.add_row(
            fmt.clip(k.name, 40),
            f"{k.count:,}",
            fmt.num(k.intensity),
            attained,
            fmt.num(k.pct_of_roof, 3),
            k.bound,
        )
    return t
