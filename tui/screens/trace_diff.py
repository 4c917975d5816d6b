"""The trace diff of two runs that hold spans (analyzers/trace_diff.py): what each step
does differently in B — ops and kernels added, removed or changed, ranked by the change
in time per step, GPU and CPU apart — then launches by API and copies by kind. The op
table sorts (s) and filters (/, e.g. `side=gpu`, `status=added`, `calls_delta>100`)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Static

from ...analyzers.names import short_name
from .. import fmt
from ..widgets.frame_table import Column, FrameView
from .base import RunScreen

STATUS_STYLE = {"added": "yellow", "removed": "cyan", "changed": "", "same": "dim"}


def _ms(v) -> str:
    return fmt.DASH if fmt.missing(v) else f"{float(v) / 1e6:,.3f}"


def _signed_ms(v) -> str:
    return fmt.DASH if fmt.missing(v) else f"{float(v) / 1e6:+,.3f}"


def _calls(v) -> str:
    return fmt.DASH if fmt.missing(v) else f"{float(v):,.1f}"


def _signed_calls(v) -> str:
    return fmt.DASH if fmt.missing(v) else f"{float(v):+,.1f}"


COLUMNS = [
    Column("side", "side", 7),
    Column("status", "status", 8, lambda v: Text(str(v), style=STATUS_STYLE.get(str(v), ""))),
    Column("name", "op or kernel", 34, lambda v: short_name(v, 34)),
    Column("time_delta_ns", "Δ ms/step", 10, _signed_ms),
    Column("time_a_ns", "A ms", 9, _ms),
    Column("time_b_ns", "B ms", 9, _ms),
    Column("calls_delta", "Δ calls", 8, _signed_calls),
    Column("calls_a", "A calls", 8, _calls),
    Column("calls_b", "B calls", 8, _calls),
]


class TraceDiffScreen(RunScreen):
    name_text = "trace diff (per step, B against A)"

    @property
    def diff(self):
        c = self.app.comparison
        return None if c is None else c.trace

    def body(self) -> ComposeResult:
        d = self.diff
        if d is None:
            yield Label("no trace diff: one of the runs holds no spans", classes="note")
            return
        with VerticalScroll(id="trace-diff"):
            yield Static(basis_text(d), id="trace-basis")
            yield Static(totals_table(d), id="trace-totals")
            ops = d.ops.assign(abs_delta=d.ops["time_delta_ns"].abs())
            yield FrameView(ops, COLUMNS, "name", sort="abs_delta", id="trace-ops")
            yield Static(launches_and_copies(d), id="trace-launches")

    def on_mount(self) -> None:
        for view in self.query(FrameView):
            view.table.focus()


def basis_text(d) -> Text:
    return Text.assemble(
        ("Per step: ", "bold"), f"A {d.basis_a.text}; B {d.basis_b.text}. ",
        ("Ranked by the change in time per step; s sorts, / filters (side=gpu, status=added).",
         "dim"),
    )  # fmt: skip


def totals_table(d) -> Table:
    t = Table("per step", "A", "B", "Δ B−A", box=None, header_style="bold dim", padding=(0, 1))
    for r in d.totals.itertuples():
        unit = str(r.unit)
        if unit == "ns":
            a, b, delta = _ms(r.a), _ms(r.b), _signed_ms(r.delta)
            label = f"{r.metric} (ms)"
        else:
            a, b, delta = fmt.num(r.a, 4), fmt.num(r.b, 4), fmt.num(r.delta, 4)
            label = f"{r.metric} ({unit})" if unit else str(r.metric)
        t.add_row(label, a, b, delta)
    return t


def launches_and_copies(d) -> Group:
    parts = []
    if len(d.launches):
        t = Table("launches by API (per step)", "A calls", "B calls", "Δ", box=None,
                  header_style="bold dim", padding=(0, 1))  # fmt: skip
        for r in d.launches.head(10).itertuples():
            t.add_row(str(r.launch_name), _calls(r.calls_a), _calls(r.calls_b),
                      _signed_calls(r.calls_delta))  # fmt: skip
        parts.append(t)
    if len(d.copies):
        t = Table("copies by kind (per step)", "A calls", "B calls", "A ms", "B ms", box=None,
                  header_style="bold dim", padding=(0, 1))  # fmt: skip
        for r in d.copies.head(10).itertuples():
            t.add_row(str(r.copy_kind), _calls(r.calls_a), _calls(r.calls_b), _ms(r.time_ns_a),
                      _ms(r.time_ns_b))  # fmt: skip
        parts.append(t)
    return Group(*parts) if parts else Group(Text("no launches or copies", style="dim"))
