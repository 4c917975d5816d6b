"""Steps 6 and 7 with two runs: what changed between A and B (one main variable?), how
the end-to-end metrics moved with their intervals, whether the outputs are the same, and
which findings appeared or went away. Enter on a differing request opens it in B."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from ...analyzers.names import short_name
from ...playbooks.triage_view import triage_view
from .. import fmt
from ..style import SEVERITY_STYLE, VERDICT_STYLE
from .base import RunScreen
from .trace_diff import STATUS_STYLE


class CompareScreen(RunScreen):
    name_text = "comparison (steps 6–7)"
    BINDINGS = [Binding("d", "trace_diff", "Trace diff")]

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "trace_diff":  # shown, and works, when both runs hold spans
            c = self.comparison
            return c is not None and c.trace is not None
        return True

    def action_trace_diff(self) -> None:
        self.app.action_open("trace_diff")

    @property
    def comparison(self):
        return self.app.comparison

    def compose(self):
        # the comparison comes after both runs are analysed
        self._wait_for = self.comparison is None
        yield from super().compose()

    def data_changed(self) -> None:
        if self._wait_for and self.comparison is not None:
            self._wait_for = False
            self.call_later(self.rebuild)
        else:
            super().data_changed()

    def body(self) -> ComposeResult:
        c = self.comparison
        if c is None:
            yield Static(self.waiting_text(), id="waiting")
            return
        a, b = self.app.datasets
        with VerticalScroll(id="compare"):
            yield Static(Text(f"A {c.run_a} ({a.identity.path})\nB {c.run_b} ({b.identity.path})"),
                         id="compare-head")  # fmt: skip
            if c.trace is not None:
                yield Static(trace_summary(c.trace), id="trace-summary")
            yield Static(variables(c.diff), id="variables")
            yield Static(deltas(c.deltas), id="deltas")
            yield Static(correctness_text(c.correctness), id="correctness")
            cr = c.correctness
            if cr.comparable and cr.mismatched:
                table = DataTable(id="mismatched", cursor_type="row")
                table.add_columns("request (outputs differ)", "")
                for rid in cr.mismatched_ids[:50]:
                    table.add_row(rid, "enter: open in B", key=rid)
                table.styles.height = min(len(cr.mismatched_ids), 6) + 1
                yield table
            yield Static(steps_against(c.triage), id="steps-against")
            yield Static(finding_changes(c), id="finding-changes")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        from .request import RequestScreen

        self.app.push_screen(RequestScreen(self.app.datasets[1], str(event.row_key.value)))


def trace_summary(trace) -> Text:
    """The trace diff's biggest changes, first (d opens the whole diff)."""
    changed = trace.changed()
    t = Text("trace diff (per step): ", style="bold")
    if not len(changed):
        t.append("no op or kernel changed", style="dim")
    for i, r in enumerate(changed.head(4).itertuples()):
        t.append(", " if i else "")
        t.append(f"{short_name(r.name, 36)} {r.status}", style=STATUS_STYLE.get(r.status, ""))
        t.append(f" ({r.time_delta_ns / 1e6:+,.3f} ms)")
    t.append(f"\n{len(changed)} ops changed of {len(trace.ops)} · d: the whole trace diff",
             style="dim")  # fmt: skip
    return t


def variables(diff) -> Group:
    main = diff.variables
    if len(main) > 1:
        title = (
            f"[bold red]{len(main)} main variables changed[/]: no difference can be pinned on one"
        )
    elif len(main) == 1:
        title = f"one main variable changed: [bold]{main[0].name}[/]"
    else:
        title = "no main variable changed: the runs are repeats"
    t = Table("what changed (step 6)", "A", "B", "kind", box=None, header_style="bold dim",
              padding=(0, 1))  # fmt: skip
    for ch in diff.changes:
        t.add_row(ch.name, fmt.clip(ch.a, 30), fmt.clip(ch.b, 30), ch.kind,
                  style="dim" if ch.kind == "measurement" else None)  # fmt: skip
    for note in diff.notes:
        t.add_row(f"[dim]note: {note}[/]", "", "", "")
    return Group(Text.from_markup(title), t)


def steps_against(triage) -> Table:
    """B's steps 6 and 7 with A as the baseline: each check's outcome."""
    t = Table("B against A", "outcome", box=None, header_style="bold dim", padding=(0, 1))
    for s in triage_view(triage).steps:
        if s.step < 6:
            continue
        for o in s.outcomes:
            style = {"fired": SEVERITY_STYLE.get(o.severity or "", ""), "passed": "green"}
            t.add_row(f"{s.step} {o.check}", Text(o.text(), style=style.get(o.status, "dim")))
    return t


def deltas(ds) -> Table | Text:
    if not ds:
        return Text("metrics not compared: a run has no serving metrics", style="yellow")
    t = Table("end-to-end (step 7)", "A", "B", "Δ B−A", "95% interval", "", box=None,
              header_style="bold dim", padding=(0, 1))  # fmt: skip
    for d in ds:
        a, b, delta, rel, ci = d.texts()
        delta += f" ({rel})" if rel else ""
        verdict = d.verdict if d.verdict != "unknown" else "no interval"
        t.add_row(
            f"{d.label} ({d.unit})", a, b, delta, ci, Text(verdict, style=VERDICT_STYLE[d.verdict])
        )
    return t


def correctness_text(c) -> Text:
    if not c.comparable:
        return Text(f"correctness (step 7): not compared — {c.reason}", style="yellow")
    if c.mismatched:
        return Text(
            f"correctness failure (step 7): outputs differ for {c.mismatched} of "
            f"{c.compared} requests ({fmt.pct(c.mismatch_rate)}; {c.length_mismatched} "
            f"differ in length). Log-probabilities: {c.logprobs}",
            style="bold red",
        )
    return Text(f"correctness (step 7): outputs identical for all {c.compared} requests "
                f"compared. Log-probabilities: {c.logprobs}", style="green")  # fmt: skip


def finding_changes(c) -> Table | Text:
    if not c.findings:
        return Text("findings: the same in both runs (steps 0–5)", style="dim")
    t = Table("finding that changed", "A", "B", "change", box=None, header_style="bold dim",
              padding=(0, 1))  # fmt: skip
    for f in c.findings:
        t.add_row(f"{f.check}: {fmt.clip(f.title, 50)}", f.severity_a or fmt.DASH,
                  f.severity_b or fmt.DASH, f.status)  # fmt: skip
    return t
