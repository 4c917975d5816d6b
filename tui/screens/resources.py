"""Step 4: are the CPU, the GPU, copies or communication what everyone waits for? Lanes
per resource over a window you move ([ ]) and zoom (+ -), with the engine's steps and the
GPU's idle gaps by cause; the window's time breakdown; busy/idle per resource, overlap
and idle gaps over the whole run."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Label, Static

from ...analyzers.names import short_name
from .. import fmt
from ..data_resources import GAP_CHAR, build_lanes, window_breakdown
from ..widgets.charts import Chart, legend, stacked_bar
from .checks import TriageStepScreen

LANE_STYLE = {"gpu": "green", "cpu": "cyan", "steps": "magenta", "gaps": "red"}
NAME_W = 16


def draw_lanes(lanes, lo: int, hi: int, width: int) -> Text:
    cells = max(width - NAME_W - 6, 10)
    out = Text()
    for lane in lanes.lanes:
        share, chars = lane.cells(lo, hi, cells)
        out.append(fmt.clip(lane.name, NAME_W - 1).ljust(NAME_W), style="bold")
        out.append("".join(chars), style=LANE_STYLE[lane.kind])
        busy = share.mean() if len(share) else 0.0
        out.append(f" {fmt.pct(busy):>5}\n")
    scale = fmt.ms_ns(0).ljust(cells // 2) + fmt.ms_ns(hi - lo).rjust(cells - cells // 2)
    out.append(" " * NAME_W + scale, style="dim")
    gaps = " ".join(f"{c} {k.replace('_', ' ')}" for k, c in GAP_CHAR.items())
    out.append(f"\nsteps: P prefill D decode M mixed · gaps: {gaps}", style="dim")
    return out


class ResourcesScreen(TriageStepScreen):
    step = 4
    preparing_text = "building the timeline (busy/idle, overlap, GPU gaps)…"
    BINDINGS = [
        # short labels: at 80 columns the footer must still show q Quit
        Binding("left_square_bracket", "move(-1)", "◀"),
        Binding("right_square_bracket", "move(1)", "▶"),
        Binding("plus", "zoom(0.5)", "Zoom in"),
        Binding("minus", "zoom(2)", "out"),
        Binding("w", "whole", "Whole run", show=False),
    ]

    def prepare(self) -> None:
        self.data.memo("lanes", build_lanes)
        _ = self.data.timeline
        _ = self.data.critical_path

    def evidence(self) -> ComposeResult:
        lanes = self.data.memo("lanes", build_lanes)
        self.lanes = lanes
        self.window = getattr(self, "window", None) or lanes.default
        if not lanes.lanes:
            yield Label("no spans or steps: nothing to draw", classes="note")
            return
        yield Label(self.window_text(), id="window-label", classes="section")
        yield Chart(lambda w: draw_lanes(lanes, *self.window, w), id="lanes")
        yield Chart(self.draw_breakdown, id="window-breakdown")
        tl = self.data.timeline
        if tl is not None:
            yield Static(resources_table(tl), id="resources")
            if len(tl.gap_summary):
                yield Static(gaps_table(tl), id="gaps")
        cp = self.data.critical_path
        if cp is not None and len(cp.segments):
            yield Static(critical_path_table(cp), id="critical-path")

    def draw_breakdown(self, width: int) -> Text:
        parts = list(window_breakdown(self.data, *self.window).items())
        seconds = [(k, v / 1e9) for k, v in parts]
        total = sum(v for _, v in seconds)
        return (Text("window breakdown (each instant once: kernel > copy > comm > runtime > CPU)\n",
                     style="bold") + stacked_bar(seconds, width, total) + Text("\n")
                + legend(seconds, fmt.duration, total=total, width=width))  # fmt: skip

    def window_text(self) -> str:
        lo, hi = self.window
        base = self.lanes.lo
        return (
            f"Window {fmt.ms_ns(lo - base)} → {fmt.ms_ns(hi - base)} of "
            f"{fmt.ms_ns(self.lanes.hi - base)}  [dim]([ ] move, + - zoom, w whole run)[/]"
        )

    def update_label(self) -> None:
        for label in self.query("#window-label"):
            label.update(self.window_text())

    def set_window(self, lo: int, hi: int) -> None:
        full_lo, full_hi = self.lanes.lo, self.lanes.hi
        width = min(max(hi - lo, 1_000), full_hi - full_lo)
        lo = min(max(lo, full_lo), full_hi - width)
        self.window = (lo, lo + width)
        for chart in self.query("#lanes, #window-breakdown"):
            chart.redraw()
        self.update_label()

    def check_action(self, action: str, parameters) -> bool | None:
        if action in ("move", "zoom", "whole"):
            return hasattr(self, "lanes") and bool(self.lanes.lanes)
        return True

    def action_move(self, direction: int) -> None:
        lo, hi = self.window
        step = (hi - lo) // 2 * direction
        self.set_window(lo + step, hi + step)

    def action_zoom(self, factor: float) -> None:
        lo, hi = self.window
        mid, half = (lo + hi) // 2, int((hi - lo) * factor / 2)
        self.set_window(mid - half, mid + half)

    def action_whole(self) -> None:
        self.set_window(self.lanes.lo, self.lanes.hi)


def resources_table(tl) -> Table:
    t = Table("resource (whole run)", "kind", "busy", "idle", "busy %", "spans", box=None,
              header_style="bold dim", padding=(0, 1))  # fmt: skip
    for r in tl.resources.itertuples():
        t.add_row(r.resource, r.kind, fmt.ms_ns(r.busy_ns), fmt.ms_ns(r.idle_ns),
                  fmt.num(r.busy_pct, 3), f"{r.spans:,}")  # fmt: skip
    o = tl.overlap
    if len(o) and (o["copy_ns"].sum() or o["comm_ns"].sum()):
        t.add_row("copies exposed", "", fmt.ms_ns(o["exposed_copy_ns"].sum()), "", "", "")
        t.add_row("comm exposed", "", fmt.ms_ns(o["exposed_comm_ns"].sum()), "", "", "")
    return t


def gaps_table(tl) -> Table:
    t = Table("GPU idle gaps", "gaps", "total", "mean", "p99", "max", box=None,
              header_style="bold dim", padding=(0, 1))  # fmt: skip
    for g in tl.gap_summary.itertuples():
        t.add_row(str(g.cause).replace("_", " "), f"{g.gaps:,}", fmt.ms_ns(g.total_ns),
                  fmt.ms_ns(g.mean_ns), fmt.ms_ns(g.p99_ns), fmt.ms_ns(g.max_ns))  # fmt: skip
    return t


def critical_path_table(cp) -> Table:
    """The critical path's make-up, then its biggest levers: what halving each op (a
    sync: removing it) saves per step in a replay of the trace."""
    steps = max(int(cp.ranks["windows"].sum()), 1)
    total = float(cp.by_kind["path_ns"].sum())
    t = Table(f"critical path ({steps} steps)", "per step", "share", "if", "saves/step",
              box=None, header_style="bold dim", padding=(0, 1))  # fmt: skip
    for bound, ns in cp.bound().items():
        t.add_row(str(bound), fmt.ms_ns(ns / steps), fmt.pct(ns / total if total else 0), "", "")
    for r in cp.items[cp.items["saved_ns"].notna()].head(5).itertuples():
        t.add_row(Text(f"{r.kind}: {short_name(r.name, 40)}", style="cyan"),
                  fmt.ms_ns(r.path_ns / steps), fmt.pct(r.share), r.what_if,
                  fmt.ms_ns(float(r.saved_ns) / steps))  # fmt: skip
    return t
