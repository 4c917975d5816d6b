"""A DataFrame as a table that stays fast at any size: sorted and filtered in pandas,
shown a page at a time, and within a page rows are added as the cursor nears them.

A DataTable row costs ~0.15 ms to add and its page-down grows with its row count, so a
100k-row table is never handed to it: at most `PAGE` rows, added `CHUNK` at a time.
Moving past a page's last row (down, page down) shows the next page, above its first row
the previous one; home/end go to the first/last page. `s`/`S` sort, `/` filters (see
query.py), enter posts `FrameView.Opened` with the row's id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from .. import fmt, query

PAGE = 500
CHUNK = 100


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    format: Callable[[object], str | Text] = lambda v: fmt.DASH if fmt.missing(v) else str(v)


def number(digits: int = 3) -> Callable[[object], str]:
    return lambda v: fmt.num(v, digits)


class FilterInput(Input):
    """The filter line: escape closes it (and keeps the filter as it was)."""

    BINDINGS = [Binding("escape", "close", "Close filter")]

    def action_close(self) -> None:
        view = self.parent
        self.display = bool(view.query_text)
        view.table.focus()


class PagedTable(DataTable):
    """The DataTable inside a FrameView: its moves cross pages."""

    def _view(self) -> FrameView:
        return self.parent  # type: ignore[return-value]

    def action_cursor_down(self) -> None:
        if self.cursor_row >= self.row_count - 1 and self._view().turn(+1):
            return
        super().action_cursor_down()

    def action_cursor_up(self) -> None:
        if self.cursor_row <= 0 and self._view().turn(-1):
            return
        super().action_cursor_up()

    def action_page_down(self) -> None:
        if self.cursor_row >= self.row_count - 1 and self._view().turn(+1):
            return
        self._view().fill(self.cursor_row + 2 * self.size.height)
        super().action_page_down()

    def action_page_up(self) -> None:
        if self.cursor_row <= 0 and self._view().turn(-1):
            return
        super().action_page_up()

    def action_scroll_top(self) -> None:
        self._view().show_page(0)

    def action_scroll_bottom(self) -> None:
        self._view().show_page(self._view().pages - 1, at_end=True)

    action_scroll_home = action_scroll_top
    action_scroll_end = action_scroll_bottom

    def watch_cursor_coordinate(self, old, new) -> None:
        super().watch_cursor_coordinate(old, new)
        if new.row >= self.row_count - self.size.height:
            self._view().fill(new.row + self.size.height + CHUNK)


class FrameView(Vertical):
    """A filter line, the paged table and a status line over one DataFrame."""

    BINDINGS = [
        Binding("s", "sort", "Sort"),
        Binding("S", "reverse", "Reverse", show=False),
        Binding("slash", "filter", "Filter"),
    ]

    class Opened(Message):
        def __init__(self, view: FrameView, ident: str) -> None:
            super().__init__()
            self.view = view
            self.ident = ident

    def __init__(self, frame: pd.DataFrame, columns: list[Column], id_column: str, *,
                 sort: str | None = None, descending: bool = True, **kwargs) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.frame = frame.reset_index(drop=True)
        self.columns = columns
        self.id_column = id_column
        self.sort_key, self.descending = sort, descending
        self.query_text = ""
        self.rows = np.arange(len(self.frame))  # positions shown, in order
        self.page = 0
        self.loaded = 0  # rows of the current page in the table
        self.status_text = ""

    def compose(self) -> ComposeResult:
        yield FilterInput(placeholder="filter: text, outcome=error, ttft>100 — enter applies",
                          classes="filter")  # fmt: skip
        table = PagedTable(cursor_type="row")
        for c in self.columns:
            table.add_column(c.label, width=c.width, key=c.key)
        yield table
        yield Static("", classes="status")

    @property
    def table(self) -> PagedTable:
        return self.query_one(PagedTable)

    @property
    def pages(self) -> int:
        return max(1, -(-len(self.rows) // PAGE))

    def on_mount(self) -> None:
        self.query_one(FilterInput).display = False
        self.apply()

    # -- the view --------------------------------------------------------------------
    def apply(self) -> None:
        """Filter, then sort, then show the first page."""
        try:
            keep = query.mask(self.frame, self.query_text, self.id_column)
        except ValueError as e:
            self.status(str(e), error=True)
            return
        rows = np.flatnonzero(keep)
        if self.sort_key is not None:
            sub = self.frame.iloc[rows]
            rows = rows[query.order(sub, self.sort_key, self.descending)]
        self.rows = rows
        self.show_page(0)

    def show_page(self, page: int, at_end: bool = False) -> None:
        self.page = min(max(page, 0), self.pages - 1)
        table = self.table
        self.loaded = 0  # before clearing: clearing moves the cursor, whose watcher fills
        table.clear()
        self.fill(PAGE if at_end else CHUNK)
        if at_end:
            table.move_cursor(row=max(table.row_count - 1, 0))
        self.status()

    def fill(self, upto: int) -> None:
        """Add rows of the current page up to `upto` (a row index in the page)."""
        start = self.page * PAGE
        end = min(start + min(upto, PAGE), len(self.rows))
        if start + self.loaded >= end:
            return
        chunk = self.frame.iloc[self.rows[start + self.loaded : end]]
        # counted before adding: adding a row moves the cursor, whose watcher fills again
        self.loaded = end - start
        cells = [chunk[c.key].tolist() for c in self.columns]
        ids = chunk[self.id_column].astype(str).tolist()
        table = self.table
        for i, ident in enumerate(ids):
            table.add_row(*(c.format(col[i]) for c, col in zip(self.columns, cells, strict=True)),
                          key=ident)  # fmt: skip

    def turn(self, delta: int) -> bool:
        """Show the next (+1) or previous (-1) page; False when there is none."""
        page = self.page + delta
        if not 0 <= page < self.pages:
            return False
        self.show_page(page, at_end=delta < 0)
        return True

    def status(self, text: str | None = None, error: bool = False) -> None:
        if text is None:
            n = len(self.rows)
            first = self.page * PAGE + 1 if n else 0
            last = min((self.page + 1) * PAGE, n)
            text = f"rows {first:,}–{last:,} of {n:,}"
            if n != len(self.frame):
                text += f" (filtered from {len(self.frame):,}: {self.query_text})"
            if self.sort_key:
                label = next((c.label for c in self.columns if c.key == self.sort_key), "")
                text += f" · sorted by {label} {'↓' if self.descending else '↑'}"
            if self.pages > 1:
                text += f" · page {self.page + 1}/{self.pages}"
        self.status_text = text
        self.query_one(".status", Static).update(Text(text, style="red" if error else "dim"))

    # -- actions ---------------------------------------------------------------------
    def sort_by(self, key: str, descending: bool | None = None) -> None:
        if descending is None:
            descending = not self.descending if key == self.sort_key else True
        self.sort_key, self.descending = key, descending
        self.apply()

    def action_sort(self) -> None:
        keys = [c.key for c in self.columns]
        nxt = (
            keys[(keys.index(self.sort_key) + 1) % len(keys)] if self.sort_key in keys else keys[0]
        )
        self.sort_by(nxt, True)

    def action_reverse(self) -> None:
        if self.sort_key is not None:
            self.sort_by(self.sort_key, not self.descending)

    def action_filter(self) -> None:
        box = self.query_one(FilterInput)
        box.display = True
        box.value = self.query_text
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_text = event.value.strip()
        event.input.display = bool(self.query_text)
        self.apply()
        self.table.focus()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(str(event.column_key.value))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.post_message(self.Opened(self, str(event.row_key.value)))

    def filter_to(self, text: str) -> None:
        """Apply a filter as if typed (for the app and tests)."""
        self.query_text = text
        self.query_one(FilterInput).display = bool(text)
        self.apply()
