"""A sweep: what it shows (the knee and the causes either side), its curves across the
points, and the points table; enter opens the selected point's run in the explorer
(escape comes back here)."""

from __future__ import annotations

import pandas as pd
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, Static

from ...sweeps.causes import readable
from ...sweeps.spec import show
from .. import fmt
from ..widgets.charts import Chart, columns


def _in_ms(value) -> str:
    """A table value already in milliseconds (fmt.ms takes seconds)."""
    return fmt.DASH if fmt.missing(value) else f"{fmt.num(value)} ms"


CURVES = (
    ("ttft_p99_ms", "TTFT p99", _in_ms),
    ("itl_p99_ms", "ITL p99", _in_ms),
    ("output_tok_s", "output tokens/s", lambda v: fmt.rate(v, "tok/s")),
    ("attainment", "SLO attainment", fmt.pct),
)
COLUMNS = (
    ("ttft_p50_ms", "TTFT p50", "ms"), ("ttft_p99_ms", "TTFT p99", "ms"),
    ("itl_p99_ms", "ITL p99", "ms"), ("tpot_p50_ms", "TPOT p50", "ms"),
    ("output_tok_s", "tok/s", ""), ("attainment", "SLO met", "%"),
)  # fmt: skip


class SweepScreen(Screen):
    AUTO_FOCUS = None  # focused on mount without scrolling: the summary shows first
    # the run explorer's keys wait until a point's run is open
    BINDINGS = [Binding(k, "nothing", show=False) for k in "rtycb01234567"]

    def __init__(self, sweep) -> None:
        super().__init__()
        self.sweep = sweep  # tui.sweep_app.SweepData

    def compose(self) -> ComposeResult:
        s = self.sweep
        yield Static(f"perfdiag · sweep {s.path} · {s.describe()}", id="title", markup=False)
        with VerticalScroll():
            yield Label("What the sweep shows", classes="section")
            yield Static(self.summary(), classes="note")
            for column, name, unit in CURVES:
                if column in s.points and s.points[column].notna().any():
                    yield Label(f"{name} across {s.axis_label}", classes="section")
                    yield Chart(lambda w, c=column, u=unit: self.curve(c, u, w))
            yield Label("Points  [dim](enter: open the point's run)[/]", classes="section")
            yield self.table()
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#points", DataTable).focus(scroll_visible=False)

    def summary(self) -> Text:
        lines = self.sweep.summary_lines() or ["no point finished yet"]
        return Text("\n".join(f"• {line}" for line in lines))

    def curve(self, column: str, unit, width: int) -> Text:
        """Columns per point, its value on top, the axis value below."""
        p = self.sweep.points[self.sweep.points["repeats"] > 0]
        values = p[column].astype(float).tolist()
        n = max(len(values), 1)
        cell = max(1, (width - 1) // n)
        chart = columns(values, cell * n, 5)
        labels = Text()
        for x in p[self.sweep.axis]:
            labels.append(fmt.clip(show(x), cell - 1).center(cell))
        tops = Text()
        for v in values:
            tops.append(fmt.clip(unit(v), cell - 1).center(cell), style="dim")
        return tops + Text("\n") + chart + Text("\n") + labels

    def table(self) -> DataTable:
        s = self.sweep
        t = DataTable(cursor_type="row", zebra_stripes=True, id="points")
        axes = s.axes
        shown = [(c, name, unit) for c, name, unit in COLUMNS if c in s.points
                 and s.points[c].notna().any()]  # fmt: skip
        t.add_columns(*[a.replace("_", "-") for a in axes], *[n for _, n, _ in shown], "cause")
        for i, r in s.points.iterrows():
            cells = [show(r[a]) for a in axes]
            for c, _, unit in shown:
                v = r[c]
                cells.append(fmt.DASH if pd.isna(v) else fmt.pct(v) if unit == "%"
                             else fmt.num(v))  # fmt: skip
            cells.append(readable(r.get("cause"), r.get("cause_title")))
            t.add_row(*cells, key=str(i))
        return t

    def action_nothing(self) -> None:
        self.app.notify("open a point first (enter): those keys explore its run")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        run = self.sweep.run_of(int(event.row_key.value))
        if run is None:
            self.app.notify("this point has no complete run")
            return
        self.app.open_point(run)
