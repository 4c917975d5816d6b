"""A triage step's screen: the step's question, its status, every check with its outcome
(fired and at what severity, passed with its value, or not evaluated and why), then the
step's own evidence (`evidence()`, written by each step's screen). Enter on a fired
check opens its finding."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Label, Static

from .. import fmt
from ..data import RunData, step_status
from ..style import OUTCOME_STYLE, SEVERITY_STYLE, STATUS_GLYPH, STATUS_STYLE
from .base import RunScreen


class TriageStepScreen(RunScreen):
    step = 0

    def __init__(self, data: RunData, step: int | None = None) -> None:
        super().__init__(data)
        if step is not None:
            self.step = step
        self.key = self.step

    @property
    def result(self):
        return next((s for s in self.data.triage.steps if s.step == self.step), None)

    def title_text(self) -> str:
        self.name_text = f"step {self.step}"
        return super().title_text()

    def body(self) -> ComposeResult:
        with VerticalScroll(id="triage-step"):
            yield Static(self.header(), id="step-head")
            yield self.checks_table()
            yield from self.evidence()

    def header(self) -> Text:
        s = self.result
        t = Text()
        if s is None:
            return Text(f"step {self.step}: not in this playbook", style="dim")
        status = step_status(s, self.data.triage.findings)
        t.append(f"Step {s.step}: {s.title}  ", style="bold")
        t.append(f"{STATUS_GLYPH[status]} {status}", style=STATUS_STYLE[status])
        return t

    def checks_table(self) -> DataTable:
        table = DataTable(id="checks", cursor_type="row")
        width = max(self.app.size.width - 34, 20)
        table.add_column("check", width=26)
        table.add_column("outcome", width=width)
        rows = self.result.checks if self.result is not None else ()
        for c in rows:
            if c.status == "fired":
                f = self.data.triage.by_check(c.check)
                text = Text(f"{c.severity}: ", style=SEVERITY_STYLE.get(c.severity or "", ""))
                text.append(fmt.clip(f.title if f else "", width - len(text)))
                key = f"finding:{c.check}"
            elif c.status == "passed":
                text = Text(f"passed ({_value(c.value)})", style=OUTCOME_STYLE["passed"])
                key = f"check:{c.check}"
            else:
                text = Text(fmt.clip(f"not evaluated: {c.reason}", width), style="dim")
                key = f"check:{c.check}"
            table.add_row(c.check, text, key=key)
        table.styles.height = min(len(rows), 12) + 1
        return table

    def evidence(self) -> ComposeResult:
        """The step's own figures and tables (none for the generic screen)."""
        yield from ()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if key.startswith("finding:"):
            from .finding import FindingScreen

            self.app.push_screen(FindingScreen(self.data, self.data.triage.by_check(key[8:])))


class ChecksScreen(TriageStepScreen):
    """Steps without figures of their own (0 data trust, 1 reproducibility, and 6–7
    with one run): the checks say it all."""

    def evidence(self) -> ComposeResult:
        if self.step in (6, 7) and len(self.app.datasets) < 2:
            yield Label("Steps 6 and 7 compare against a baseline: perfdiag tui BASELINE RUN",
                        classes="note")  # fmt: skip


def _value(v) -> str:
    if isinstance(v, float):
        return fmt.num(v)
    return fmt.DASH if v is None else str(v)
