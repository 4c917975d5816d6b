"""Where a sweep's curve bends, and what limits the runs on either side of the bend.

The knee is Kneedle's (Satopää et al., 2011, via the `kneed` package): normalise the
curve to the unit square and take the point farthest from the chord joining its ends.
Its shape (convex or concave, increasing or decreasing) is read from the data, not
assumed. A curve whose two ends lie within each other's confidence intervals has no
knee: its changes are noise.

Which curve: `--knee-metric` if given; on a load axis (rate, concurrency) the SLO's
attainment when an SLO is set, TTFT p99 otherwise (queueing shows first in the time to
first token); on an engine knob the latency metric that moves most across the sweep
beyond its noise (a chunk size moves ITL p99 and TTFT in opposite directions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .table import LABELS, separated

KNOB_METRICS = ("ttft_p99_ms", "ttft_p50_ms", "itl_p99_ms", "tpot_p50_ms", "e2e_p50_s")


@dataclass(frozen=True)
class Knee:
    metric: str
    index: int  # position along the axis (within the series)
    shape: str  # e.g. "convex, increasing"


def knee_metric(table: pd.DataFrame, is_load: bool, has_slo: bool) -> str:
    if is_load:
        # attainment when the SLO breaks somewhere in the sweep; else queueing's first sign
        if has_slo and "attainment" in table and _moves(table, "attainment"):
            return "attainment"
        return "ttft_p99_ms"
    best, best_move = "ttft_p99_ms", -1.0
    for column in KNOB_METRICS:
        v = table[column].to_numpy("float64") if column in table else np.zeros(0)
        if len(v) < 2 or not np.isfinite(v).all() or v.min() <= 0:
            continue
        if not _moves(table, column):
            continue
        move = v.max() / v.min()
        if move > best_move:
            best, best_move = column, move
    return best


def find_knee(x: np.ndarray, y: np.ndarray) -> tuple[int, str] | None:
    """The knee's index and the curve's shape, or None (fewer than 3 points, flat)."""
    from kneed import KneeLocator

    ok = np.isfinite(x) & np.isfinite(y)
    x, y = np.asarray(x, float)[ok], np.asarray(y, float)[ok]
    if len(x) < 3 or np.ptp(y) == 0 or np.ptp(x) == 0:
        return None
    direction = "increasing" if y[-1] >= y[0] else "decreasing"
    xn = (x - x.min()) / np.ptp(x)
    yn = (y - y.min()) / np.ptp(y)
    chord = xn if direction == "increasing" else 1 - xn
    curve = "convex" if np.mean((yn - chord)[1:-1]) < 0 else "concave"
    located = KneeLocator(x, y, curve=curve, direction=direction, online=True).knee
    if located is None:
        return None
    index = int(np.flatnonzero(ok)[int(np.argmin(np.abs(x - located)))])
    return index, f"{curve}, {direction}"


def knee_of(series: pd.DataFrame, axis: str, metric: str) -> Knee | None:
    """The knee of `metric` along `axis` in one series (rows sorted by the axis)."""
    if metric not in series or len(series) < 3:
        return None
    first, last = series.iloc[0], series.iloc[-1]
    if _has_interval(series, metric) and not separated(first, last, metric):
        return None  # the ends agree within noise: no bend to name
    found = find_knee(_numeric(series[axis]), series[metric].to_numpy("float64"))
    if found is None:
        return None
    return Knee(metric, found[0], found[1])


def _has_interval(table: pd.DataFrame, metric: str) -> bool:
    lo, hi = f"{metric}_lo", f"{metric}_hi"
    return lo in table and hi in table and bool(table[[lo, hi]].notna().all().all())


def _moves(table: pd.DataFrame, metric: str) -> bool:
    """Whether the lowest and highest points of `metric` differ beyond their intervals."""
    v = table[metric].to_numpy("float64")
    if len(v) < 2 or not np.isfinite(v).any():
        return False
    lo, hi = int(np.nanargmin(v)), int(np.nanargmax(v))
    return separated(table.iloc[lo], table.iloc[hi], metric)


def _numeric(values: pd.Series) -> np.ndarray:
    """Axis values as numbers; categorical axes (policy, preset) use their position."""
    as_num = pd.to_numeric(values, errors="coerce").to_numpy("float64")
    return as_num if np.isfinite(as_num).all() else np.arange(len(values), dtype=float)


def label(metric: str) -> str:
    return LABELS.get(metric, metric)
