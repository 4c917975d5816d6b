"""A triage step's screen: the step's question, its status, every check with its outcome
(fired and at what severity, passed with its value, or not evaluated and why), then the
step's own evidence (`evidence()`, written by each step's screen). Enter on a fired
check opens its finding."""

from __future__ import annotations

import textwrap

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Label, Static

from .. import fmt
from ..data import RunData
from ..style import OUTCOME_STYLE, SEVERITY_STYLE, step_status_text
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
        """The step as every renderer shows it (playbooks/triage_view.py), or None."""
        return self.data.view.step(self.step) if self.data.view is not None else None

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
            triage = self.data.triage
            why = triage.applicability if triage is not None and triage.applicability else ""
            return Text(f"step {self.step}: {why or 'not in this playbook'}", style="dim")
        t.append(f"Step {s.step}: {s.title}  ", style="bold")
        t.append_text(step_status_text(s))
        t.append(f"\n{s.counts.text()}", style="dim")
        return t

    def checks_table(self) -> DataTable:
        table = DataTable(id="checks", cursor_type="row")
        width = max(self.app.size.width - 34, 20)
        table.add_column("check", width=26)
        table.add_column("outcome", width=width)
        rows = self.result.outcomes if self.result is not None else ()
        for o in rows:
            if o.status == "fired":
                text = Text(f"{o.severity}: ", style=SEVERITY_STYLE.get(o.severity or "", ""))
                text.append(o.title)
                key = f"finding:{o.check}"
            else:
                text = Text(o.text(), style=OUTCOME_STYLE[o.status])
                key = f"check:{o.check}"
            # rows as tall as their text: a cut reason would lose the command to run
            table.add_row(fmt.clip(o.check, 26), text, key=key, height=_lines(text.plain, width))
        table.styles.height = min(sum(_lines(o.text(), width) for o in rows), 16) + 1
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


def _lines(text: str, width: int) -> int:
    return max(len(textwrap.wrap(text, width)), 1)
