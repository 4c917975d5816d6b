"""Tables that fit the terminal without cutting a number.

Rich shrinks a table that is too wide by cutting cells ("106.…", "[-15,606.2…"). `fit`
prevents that: a cell that is a number ("1,220.049", "12.3 ms", "+3.11 (+156%)",
"[-0.0224, +0.476]") sets its column's least width, so it never wraps or shrinks; text
wraps between words (a word of up to WORD_MAX characters is kept whole), and a longer
word folds onto the next line at WORD_MAX rather than losing its end (nor squeezing its
column to a few cells: that column is at least WORD_MAX wide). When the numbers alone do
not fit, whole columns are left out, lowest priority first — columns with nothing in them
(all zero or blank), then in the order the caller gives, then from the right — and the
caption names what was left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

WORD_MAX = 20  # a word up to this long in a text column is kept whole (longer ones fold)
_N = r"[-+−<>~]?\d[\d,.]*(?:e[-+]?\d+)?%?"
# A number: "1,220.049", "27.8%", "12.3 ms", "+3.11 (+156%)", "[-0.0224, +0.476]", "<0.01%".
_NUMBER = re.compile(rf"[\[(]?{_N}(?: ?[a-zA-Zµ/]{{1,8}})?(?:,? ?\(?{_N}\)?)?[\])]?")
_EMPTY = re.compile(r"^(|[-–]|[-+]?0(\.0+)?%?)$")


def fit(
    table: Table,
    console: Console,
    keep: Sequence[str] = (),
    drop: Sequence[str] = (),
) -> Table:
    """`table`, its columns set so that it fits `console`'s width with every number whole.

    `keep`: headers never left out (the first column is always kept); `drop`: headers to
    leave out first, in that order, before the rest from the right."""
    for column in table.columns:
        cells = [_plain(c).strip() for c in column._cells]
        numbers = [cell_len(c) for c in cells if _NUMBER.fullmatch(c)]
        words = [cell_len(w) for c in cells for w in c.split() if not _NUMBER.fullmatch(c)]
        # a longer word folds at WORD_MAX rather than leave its column a few cells wide
        words = [min(w, WORD_MAX) for w in words]
        heading = [cell_len(w) for w in _plain(column.header).split()]
        column.min_width = max([*numbers, *words, *heading, 1])
        if numbers and len(numbers) == sum(1 for c in cells if c):
            column.justify = "right"  # a column of numbers lines up on their last digit
        column.overflow = "fold"  # at least as wide as its numbers, so only text folds
    width = console.width
    left_out: list[str] = []
    for name in _drop_order(table, keep, drop):
        if _min_width(table) <= width:
            break
        index = next(i for i, c in enumerate(table.columns) if _plain(c.header) == name)
        left_out.append(name)
        del table.columns[index]
        for i, column in enumerate(table.columns):
            column._index = i  # rich finds a column's padding and edge by its index
    _set_widths(table, width)
    if left_out:
        note = f"not shown at {width} columns: {', '.join(left_out)} (a wider terminal shows them)"
        table.caption = f"{table.caption}; {note}" if table.caption else note
        table.caption_justify = "left"
    return table


def _set_widths(table: Table, width: int) -> None:
    """Fixed widths: each column's natural width, the widest narrowed first (never below
    its least width) until the table fits. Rich's own shrinking narrows columns evenly
    and then widens them back to their least widths, which can leave a table wider than
    the terminal."""
    widths = [
        max(*(cell_len(line) for c in (col.header, *col._cells) for line in _plain(c).split("\n")),
            col.min_width or 1)
        for col in table.columns
    ]  # fmt: skip
    budget = width - _overhead(table)
    while sum(widths) > budget:
        narrowable = [i for i, c in enumerate(table.columns) if widths[i] > (c.min_width or 1)]
        if not narrowable:
            break
        widths[max(narrowable, key=lambda i: widths[i])] -= 1
    for column, w in zip(table.columns, widths, strict=True):
        column.width = w


def _drop_order(table: Table, keep: Sequence[str], drop: Sequence[str]) -> list[str]:
    headers = [_plain(c.header) for c in table.columns]
    kept = {headers[0], *keep} if headers else set(keep)
    empty = [
        h
        for h, c in zip(headers, table.columns, strict=True)
        if c._cells and all(_EMPTY.match(_plain(x).strip()) for x in c._cells)
    ]
    order = [*empty, *drop, *reversed(headers)]
    return [h for h in dict.fromkeys(order) if h in headers and h not in kept]


def _min_width(table: Table) -> int:
    """The narrowest the table can be with every column at its least width."""
    return sum(c.min_width or 0 for c in table.columns) + _overhead(table)


def _overhead(table: Table) -> int:
    """Padding and borders."""
    n = len(table.columns)
    _, right, _, left = table.padding
    pads = (left + right) * n
    if not table.pad_edge:
        pads -= left + right
    return pads + ((n - 1 + (2 if table.show_edge else 0)) if table.box else 0)


def _plain(cell) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        if "[" not in cell:
            return cell
        try:
            return Text.from_markup(cell).plain
        except Exception:  # not markup after all ("[-1.5, +2]" is an interval)
            return cell
    return str(cell)
