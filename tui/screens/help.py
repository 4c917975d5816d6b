"""The keys, on one screen (? opens it anywhere, escape or ? closes it)."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("Everywhere", (
        ("?", "this help"),
        ("escape", "back to the previous screen"),
        ("o", "the overview (findings, triage steps, run identity)"),
        ("0 … 7", "the triage step's screen: 0 data trust, 1 reproducibility, 2 load, "
                  "3 latency, 4 resources, 5 cache, 6–7 comparison and correctness"),
        ("r / t", "the requests table / the steps table"),
        ("y", "the roofline"),
        ("c", "the comparison (with two runs)"),
        ("b", "explore the other run (with two runs)"),
        ("q", "quit"),
    )),
    ("Tables", (
        ("↑ ↓ pgup pgdn home end", "move (rows are added as you scroll)"),
        ("enter", "open the row: a finding's evidence, a request, a step"),
        ("tab", "the next table or panel"),
        ("s / S", "sort by the next column / reverse the order (or click a header)"),
        ("/", "filter: text matches ids; outcome=error; ttft>100 (ms columns in ms)"),
    )),
    ("Finding", (("g", "the finding's triage step, with its figures"),)),
    ("Resources", (
        ("[ ]", "move the time window left / right"),
        ("+ -", "zoom in / out"),
    )),
)  # fmt: skip


class HelpScreen(ModalScreen):
    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(self.table())

    def table(self) -> Table:
        t = Table(title="perfdiag tui — keys (mouse: click rows, headers, scroll)",
                  show_header=False, box=None, title_style="bold", expand=True)  # fmt: skip
        t.add_column(style="bold cyan", no_wrap=True)
        t.add_column()
        for section, rows in KEYS:
            t.add_row(f"[b]{section}[/]", "")
            for key, what in rows:
                t.add_row(f"  {key}", what)
        return t
