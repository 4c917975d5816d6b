"""The first screen: the top cause, the ranked findings, the triage steps with their
status, the key metrics and the run's identity. Identity shows at once; metrics,
findings and steps fill in as the background analysis reaches them."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Label, ProgressBar, Static

from .. import fmt
from ..data import RunData
from ..style import SEVERITY_STYLE, severity_label, step_status_text
from .base import RunScreen


class OverviewScreen(RunScreen):
    name_text = "overview"
    needs_analysis = False

    def __init__(self, data: RunData) -> None:
        super().__init__(data)
        self._stage = None

    def body(self) -> ComposeResult:
        d = self.data
        self._stage = d.stage
        self._compared = self.app.comparison is not None
        with VerticalScroll(id="overview"):
            if not d.ready:
                stage, share = self.app.progress
                yield Label(f"analysing… {stage}", id="progress-label")
                bar = ProgressBar(total=1.0, show_eta=False, id="progress")
                bar.progress = share
                yield bar
            else:
                yield Static(self.headline(), id="headline")
            if d.serving is not None:
                yield Static(self.strip(), id="strip")
            if d.ready:
                yield Label("Findings, ranked  [dim](enter: evidence)[/]", classes="section")
                yield self.findings_table()
                yield Label("Triage steps  [dim](enter or 0–7: the step's screen)[/]",
                            classes="section")  # fmt: skip
                yield self.steps_table()
            with Horizontal(id="about"):
                if d.serving is not None:
                    yield Static(self.metrics_table(), id="metrics")
                yield Static(self.identity_table(), id="identity")

    # -- parts -------------------------------------------------------------------
    def headline(self) -> Text:
        v = self.data.view
        top = v.top
        text = Text()
        text.append("Top cause: ", style="bold")
        if top is None:
            text.append(v.verdict, style="green" if not v.problems else "yellow")
        else:
            text.append(severity_label(top.severity) + " ", style=SEVERITY_STYLE[top.severity])
            text.append(v.verdict)
        text.append("\nSteps 0 and 1: ", style="bold")
        serious = any(f.severity != "info" for f in v.qualifiers)
        text.append(v.gate_summary, style="yellow" if serious else "dim")
        return text

    def strip(self) -> Text:
        """The key latencies on one line, to read before scrolling."""
        m = self.data.get("metrics")
        if m is None:
            reason = self.data.missing_reason("metrics")
            return Text(f"no serving metrics: {reason}", style="dim")
        o = m.outcomes
        failed = o.error + o.rejected + o.timeout + o.unfinished
        return Text(
            f"TTFT p50 {fmt.ms(m.ttft_s.p50)} p99 {fmt.ms(m.ttft_s.p99)} · "
            f"ITL p99 {fmt.ms(m.itl_per_chunk_s.p99)} · "
            f"{fmt.num(m.throughput.output_tokens_per_s)} tok/s · "
            f"{o.ok} ok, {failed} failed",
            style="bold",
        )

    def findings_table(self) -> DataTable:
        table = DataTable(id="findings", cursor_type="row", zebra_stripes=False)
        width = max(self.app.size.width - 22, 20)
        table.add_column("#", width=2)
        table.add_column("sev", width=4)
        table.add_column("step", width=4)
        table.add_column("finding", width=width)
        for f in self.data.findings():
            title = ("↳ " if f.consequence_of else "") + f.title
            table.add_row(
                str(f.rank),
                Text(severity_label(f.severity), style=SEVERITY_STYLE[f.severity]),
                str(f.step),
                fmt.clip(title, width),
                key=f"finding:{f.check}",
            )
        table.styles.height = min(len(self.data.findings()), 8) + 1
        return table

    def steps_table(self) -> DataTable:
        table = DataTable(id="steps", cursor_type="row")
        width = self.question_width()
        table.add_column("step", width=4)
        table.add_column("status", width=15)
        table.add_column("question", width=width)
        table.add_column("checks", width=self.counts_width())
        self.fill_steps(table, width)
        table.styles.height = len(self.step_rows()) + 1
        return table

    def counts_width(self) -> int:
        """Wide enough for every step's counts (they are never cut)."""
        return max((len(s.counts.short()) for s in self.step_rows()), default=12)

    def question_width(self) -> int:
        return max(self.app.size.width - 33 - self.counts_width(), 16)

    def fill_steps(self, table: DataTable, width: int) -> None:
        for s in self.step_rows():
            table.add_row(
                str(s.step),
                step_status_text(s),
                fmt.clip(s.title, width),
                s.counts.short(),
                key=f"step{s.step}",
            )

    def step_rows(self):
        """This run's steps; with two runs, steps 6–7 are B's checks against A."""
        rows = self.data.steps()
        c = self.app.comparison
        if c is None:
            return rows
        from dataclasses import replace

        from ...playbooks.triage_view import triage_view

        against = {s.step: s for s in triage_view(c.triage).steps if s.step >= 6}
        return tuple(
            replace(against[s.step], title=f"{s.title} (B against A)") if s.step in against else s
            for s in rows
        )

    def metrics_table(self) -> Table:
        t = Table.grid(padding=(0, 1))
        t.add_column(style="dim")
        t.add_column()
        for e in self.data.metrics():
            t.add_row(e.label, e.text())
        return _panel(t, "Key metrics")

    def identity_table(self) -> Table:
        ident = self.data.identity
        t = Table.grid(padding=(0, 1))
        t.add_column(style="dim", no_wrap=True)
        t.add_column(overflow="fold")
        t.add_row("run", f"{ident.run_id} ({ident.status}, {ident.source})")
        t.add_row("path", ident.path)
        for label, text in ident.rows:
            t.add_row(label, text)
        return _panel(t, "Run")

    # -- events ------------------------------------------------------------------
    def data_changed(self) -> None:
        compared = self.app.comparison is not None
        if self.data.stage != self._stage:
            self.call_later(self.rebuild)
            return
        if compared != self._compared:
            # the comparison came while the user may be moving in the tables: refill the
            # steps in place, keeping the focus and the cursor
            self._compared = compared
            for table in self.query("#steps").results(DataTable):
                row = table.cursor_row
                table.clear()
                self.fill_steps(table, self.question_width())
                table.move_cursor(row=row)
            return
        stage, share = self.app.progress
        for bar in self.query("#progress"):
            bar.progress = share
        for label in self.query("#progress-label"):
            label.update(f"analysing… {stage}")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if key.startswith("finding:"):
            from .finding import FindingScreen

            f = self.data.triage.by_check(key.split(":", 1)[1])
            self.app.push_screen(FindingScreen(self.data, f))
        elif key.startswith("step"):
            self.app.action_open(key)


def _panel(table: Table, title: str) -> Table:
    outer = Table(title=title, title_justify="left", show_header=False, box=None, expand=True,
                  title_style="bold")  # fmt: skip
    outer.add_column()
    outer.add_row(table)
    return outer
