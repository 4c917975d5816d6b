"""Charts drawn in character cells with Rich text: stacked bars (a decomposition), a
column chart over time with a reference line, and a log-log scatter under a roofline.

Each is a pure function of numbers and a width (tested without a terminal); `Chart` is
the widget that redraws one at its current width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from rich.text import Text
from textual.widget import Widget

from .. import fmt

BLOCKS = " ▁▂▃▄▅▆▇█"
PALETTE = ("cyan", "magenta", "yellow", "green", "blue", "red", "bright_black", "white")


class Chart(Widget):
    """A widget whose content is `draw(width)`: measured and drawn at the width it gets,
    so nothing wraps and the height is exactly the drawing's."""

    DEFAULT_CSS = "Chart { height: auto; }"

    def __init__(self, draw: Callable[[int], Text], **kwargs) -> None:
        super().__init__(**kwargs)
        self.draw = draw
        self._cache: tuple[int, Text] | None = None

    def _text(self, width: int) -> Text:
        width = max(width, 20)
        if self._cache is None or self._cache[0] != width:
            self._cache = (width, self.draw(width))
        return self._cache[1]

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._text(width).split("\n"))

    def render(self) -> Text:
        return self._text(self.content_region.width)

    def redraw(self) -> None:
        self._cache = None
        self.refresh(layout=True)


def stacked_bar(parts: Sequence[tuple[str, float]], width: int, total: float | None = None,
                styles: Sequence[str] = PALETTE) -> Text:  # fmt: skip
    """One bar of `width` cells split among `parts` (label, value) in proportion; cells
    go to the largest remainders so the bar is exactly `width` long (when the parts sum
    to `total`)."""
    values = [max(float(v), 0.0) if v == v else 0.0 for _, v in parts]
    whole = total if total and total > 0 else sum(values)
    text = Text()
    if whole <= 0:
        return Text("·" * width, style="dim")
    exact = [v / whole * width for v in values]
    cells = [int(x) for x in exact]
    left = min(width, round(sum(exact))) - sum(cells)
    for i in sorted(range(len(exact)), key=lambda i: exact[i] - cells[i], reverse=True)[:left]:
        cells[i] += 1
    for i, n in enumerate(cells):
        text.append("█" * n, style=styles[i % len(styles)])
    return text


def legend(parts: Sequence[tuple[str, float]], unit: Callable[[float], str],
           styles: Sequence[str] = PALETTE, total: float | None = None,
           width: int = 10_000) -> Text:  # fmt: skip
    """The key of a stacked bar with each part's value and share, wrapped at `width`."""
    whole = total if total else sum(v for _, v in parts if v == v)
    entries = []
    for i, (label, v) in enumerate(parts):
        if not v or v != v:
            continue
        share = f" {fmt.pct(v / whole)}" if whole else ""
        entries.append((styles[i % len(styles)], f"{label} {unit(v)}{share}"))
    return _wrap(entries, width)


def decomposition(parts: Sequence[tuple[str, float]], width: int, total: float,
                  unit: Callable[[float], str]) -> Text:  # fmt: skip
    """A stacked bar of `parts` over `total`, with its key below."""
    return stacked_bar(parts, width, total) + Text("\n") + legend(parts, unit, total=total,
                                                                   width=width)  # fmt: skip


def _wrap(entries: list[tuple[str, str]], width: int) -> Text:
    text, used = Text(), 0
    for style, label in entries:
        n = len(label) + 4
        if used and used + n > width:
            text.append("\n")
            used = 0
        text.append("█ ", style=style)
        text.append(label + "  ")
        used += n
    return text


def columns(values: Sequence[float], width: int, height: int, reference: float | None = None,
            style: str = "cyan") -> Text:  # fmt: skip
    """A column chart: `values` resampled to `width` columns (mean per column), scaled
    to the larger of their max and `reference`; the reference shows as a dotted line."""
    vals = _resample([v if v == v else 0.0 for v in values], width)
    top = max([*vals, reference or 0.0, 1e-12])
    rows = []
    ref_row = None
    if reference is not None and reference > 0:
        ref_row = min(height - 1, int(reference / top * height - 1e-9))
    for r in range(height - 1, -1, -1):
        line = Text()
        for v in vals:
            level = v / top * height - r  # how much of this cell is filled (0..1+)
            if level >= 1:  # the reference line stays visible across a full bar
                line.append(
                    "━" if r == ref_row else "█",
                    style=f"yellow on {style}" if r == ref_row else style,
                )
            elif level > 0:
                line.append(BLOCKS[max(1, int(level * 8))], style=style)
            elif r == ref_row:
                line.append("┄", style="yellow")
            else:
                line.append(" ")
        rows.append(line)
    return Text("\n").join(rows)


def _resample(values: Sequence[float], width: int) -> list[float]:
    n = len(values)
    if n == 0:
        return [0.0] * width
    out = []
    for i in range(width):
        a, b = i * n // width, max((i + 1) * n // width, i * n // width + 1)
        chunk = values[a:b]
        out.append(sum(chunk) / len(chunk))
    return out


def scatter_loglog(series: Sequence[tuple[str, Sequence[float], Sequence[float], str]],
                   width: int, height: int, roof: Callable[[float], float] | None = None,
                   ) -> tuple[Text, tuple[float, float, float, float]]:  # fmt: skip
    """Points of several series (label, xs, ys, glyph) on log-log axes over whole decades,
    under `roof(x)` drawn as a line; later series draw over earlier ones. Vectorised: a
    million points cost one numpy pass. Returns the plot and its (log10) bounds."""
    pts = []
    for _, a, b, glyph in series:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
        pts.append((np.log10(x[ok]), np.log10(y[ok]), glyph))
    xs = np.concatenate([p[0] for p in pts]) if pts else np.empty(0)
    ys = np.concatenate([p[1] for p in pts]) if pts else np.empty(0)
    x_lo, x_hi = _decades(xs, -1.0, 3.0)
    y_lo, y_hi = _decades(ys, 9.0, 12.0)
    if roof is not None:  # the roof's peak belongs on the chart
        top = max(roof(10**x_hi), roof(10**x_lo))
        y_hi = max(y_hi, math.ceil(math.log10(top))) if top > 0 else y_hi
    grid = [[" "] * width for _ in range(height)]
    styles = [[""] * width for _ in range(height)]

    def cells(lx: np.ndarray, ly: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = np.clip(((lx - x_lo) / (x_hi - x_lo) * width).astype(int), 0, width - 1)
        r = height - 1 - np.clip(((ly - y_lo) / (y_hi - y_lo) * height).astype(int), 0, height - 1)
        return r, c

    if roof is not None:
        lx = x_lo + (np.arange(width) + 0.5) / width * (x_hi - x_lo)
        ly = np.log10(np.maximum([roof(10**v) for v in lx], 1e-30))
        inside = (ly >= y_lo) & (ly <= y_hi)
        for r, c in zip(*cells(lx[inside], ly[inside]), strict=True):
            grid[r][c], styles[r][c] = "─", "yellow"
    for i, (lx, ly, glyph) in enumerate(pts):
        style = PALETTE[i % len(PALETTE)]
        for r, c in set(zip(*cells(lx, ly), strict=True)):
            grid[r][c], styles[r][c] = glyph, f"bold {style}"
    text = Text()
    for r in range(height):
        for c in range(width):
            text.append(grid[r][c], style=styles[r][c] or None)
        if r < height - 1:
            text.append("\n")
    return text, (x_lo, x_hi, y_lo, y_hi)


def _decades(values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """Whole decades around log10 values (a default range when there are none)."""
    if not len(values):
        return lo, hi
    a, b = math.floor(values.min()), math.ceil(values.max())
    return float(a), float(max(b, a + 1))


def swatches(labels: Sequence[str], styles: Sequence[str] = PALETTE, width: int = 10_000) -> Text:
    """The colour key of a stacked bar, wrapped at `width`."""
    return _wrap([(styles[i % len(styles)], label) for i, label in enumerate(labels)], width)
