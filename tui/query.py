"""The filter language of the explorer's tables, applied to a DataFrame as a mask.

A query is words joined by AND:
- `text`: rows whose id contains it (case-insensitive);
- `column=value`, `column!=value`: text or number equality (`outcome=error`);
- `column>number`, `>=`, `<`, `<=`: numeric comparisons in the column's display unit
  (`ttft>100` is TTFT above 100 ms).
A column is named by its key or a prefix of it (`ttft` for `ttft_ms`). A bad query raises
`ValueError` naming the word, which the table shows instead of filtering.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

_TERM = re.compile(r"^([A-Za-z_][\w.]*)\s*(>=|<=|!=|=|>|<)\s*(.+)$")


def column_named(frame: pd.DataFrame, name: str) -> str:
    name = name.lower()
    if name in frame.columns:
        return name
    found = [c for c in frame.columns if str(c).lower().startswith(name)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError(f"no column {name!r} (columns: {', '.join(map(str, frame.columns))})")
    raise ValueError(f"{name!r} names several columns: {', '.join(found)}")


def mask(frame: pd.DataFrame, query: str, id_column: str) -> np.ndarray:
    """Rows of `frame` matching every word of `query` (all rows for an empty query)."""
    keep = np.ones(len(frame), dtype=bool)
    for word in query.split():
        m = _TERM.match(word)
        if m is None:
            ids = frame[id_column].astype(str).str.lower()
            keep &= ids.str.contains(word.lower(), regex=False).to_numpy()
            continue
        col = column_named(frame, m.group(1))
        op, raw = m.group(2), m.group(3)
        values = frame[col]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            try:
                x = float(raw)
            except ValueError:
                raise ValueError(f"{word!r}: {col} is a number") from None
            v = values.to_numpy(dtype="float64", na_value=np.nan)
            with np.errstate(invalid="ignore"):
                hit = {">": v > x, ">=": v >= x, "<": v < x, "<=": v <= x,
                       "=": v == x, "!=": v != x}[op]  # fmt: skip
        else:
            if op not in ("=", "!="):
                raise ValueError(f"{word!r}: {col} is text; use = or !=")
            text = values.astype(str).str.lower().to_numpy()
            hit = text == raw.lower()
            if op == "!=":
                hit = ~hit
        keep &= hit
    return keep


def order(frame: pd.DataFrame, column: str, descending: bool) -> np.ndarray:
    """Row positions sorted by `column`, missing values last in either direction."""
    values = frame[column]
    missing = values.isna().to_numpy()
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        key = values.to_numpy(dtype="float64", na_value=np.nan)
        key = np.where(missing, 0.0, -key if descending else key)
        idx = np.lexsort((key, missing))
    else:
        codes, _ = pd.factorize(values.astype(str), sort=True)
        codes = -codes if descending else codes
        idx = np.lexsort((codes, missing))
    return idx
