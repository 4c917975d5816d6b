"""One finding and its evidence: the numbers behind it, the requests and steps that show
it most (enter opens them), what to try, and the triage step's screen (g)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Label, Static

from ...analyzers.findings import Finding
from ..data import RunData
from ..style import SEVERITY_STYLE, severity_label
from .base import RunScreen


class FindingScreen(RunScreen):
    BINDINGS = [Binding("g", "goto_step", "Step screen")]

    def __init__(self, data: RunData, finding: Finding) -> None:
        super().__init__(data)
        self.finding = finding
        self.key = finding.check
        self.name_text = f"finding {finding.rank}: {finding.check}"

    def body(self) -> ComposeResult:
        f = self.finding
        with VerticalScroll(id="finding"):
            yield Static(self.header(), id="finding-head")
            yield Static(self.evidence(), id="evidence")
            if f.ids:
                yield Label("Worst by id  [dim](enter: open)[/]", classes="section")
                yield self.ids_table()
            if f.recommendations:
                yield Static(self.recommendations(), id="try")
            yield Static(
                Text(f"g: the evidence of step {f.step} ({f.step_title})", style="dim"),
                id="goto",
            )

    def header(self) -> Text:
        f = self.finding
        t = Text()
        t.append(f"{severity_label(f.severity)} ", style=SEVERITY_STYLE[f.severity])
        t.append(f"step {f.step} · {f.check} · rank {f.rank}", style="dim")
        if f.cause:
            t.append(f" · {' '.join(f.cause)}", style="dim")
        t.append(f"\n{f.title}\n", style="bold")
        t.append(f.explanation)
        return t

    def evidence(self) -> Table:
        t = Table("evidence", "value", title=None, box=None, header_style="bold dim")
        for e in self.finding.evidence:
            t.add_row(e.label, e.text())
        return t

    def ids_table(self) -> DataTable:
        table = DataTable(id="ids", cursor_type="row")
        table.add_columns("kind", "id", "why")
        # Rows are keyed by position, not id: an id may appear in two lists (or twice in
        # one), and a duplicate key would end the app.
        self.targets: list[tuple[str, str]] = []
        for ids in self.finding.ids:
            for i in ids.ids:
                table.add_row(ids.kind, i, ids.label, key=str(len(self.targets)))
                self.targets.append((ids.kind, i))
        table.styles.height = min(len(self.targets), 10) + 1
        return table

    def recommendations(self) -> Text:
        t = Text()
        for r in self.finding.recommendations:
            t.append("try: ", style="green")
            t.append(r + "\n")
        return t

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        kind, ident = self.targets[int(str(event.row_key.value))]
        if kind == "request":
            from .request import RequestScreen

            self.app.push_screen(RequestScreen(self.data, ident))
        elif kind == "step":
            from .step import EngineStepScreen

            self.app.push_screen(EngineStepScreen(self.data, int(ident)))

    def action_goto_step(self) -> None:
        self.app.action_open(f"step{self.finding.step}")
