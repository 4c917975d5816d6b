"""Triage step 2 over time: requests offered per interval against the plan and the
target, lateness and client waits per interval, requests in flight and the engine's
queue. Bins tile the sending period (first planned send → last send), so a client
falling behind shows where it starts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .data import RunData


@dataclass(frozen=True)
class LoadSeries:
    t0_s: float  # bins start here (seconds from the first send)
    bin_s: float
    offered: np.ndarray  # requests sent per second, per bin
    planned: np.ndarray  # requests due per second (scheduled_send), per bin (NaN: no plan)
    target_rps: float | None  # the configured rate (open loop)
    late_ms: np.ndarray  # worst lateness (created − scheduled) per bin
    wait_ms: np.ndarray  # worst client wait (sent − created) per bin
    in_flight: np.ndarray  # time-weighted mean in flight per bin
    waiting: np.ndarray  # mean engine waiting queue per bin (NaN: no steps)


def load_series(data: RunData, bins: int | None = None) -> LoadSeries | None:
    m, load = data.get("metrics"), data.get("load")
    if m is None or load is None:
        return None
    pr = m.per_request
    sent = pr["sent_ns"].to_numpy(dtype="float64", na_value=np.nan)
    ok = ~np.isnan(sent)
    if ok.sum() < 2:
        return None
    if bins is None:  # about three sends per bin, so a rate is a rate, not 0 or 1
        bins = int(np.clip(ok.sum() // 3, 4, 120))
    origin = np.nanmin(sent)
    sent_s = (sent - origin) / 1e9
    wait = pr["client_wait_s"].to_numpy()
    late = pr["lateness_s"].to_numpy()
    planned_s = sent_s - np.nan_to_num(wait) - np.nan_to_num(late)
    planned_s[np.isnan(late) | np.isnan(wait)] = np.nan
    lo = float(np.nanmin(np.r_[sent_s[ok], planned_s[~np.isnan(planned_s)]]))
    hi = float(np.nanmax(sent_s))
    width = max((hi - lo) / bins, 1e-9)
    edges = lo + width * np.arange(bins + 1)
    edges[-1] = np.nextafter(hi, np.inf)

    def per_bin(t: np.ndarray) -> np.ndarray:
        t = t[~np.isnan(t)]
        return np.histogram(t, edges)[0] / width

    def worst(t: np.ndarray, v: np.ndarray) -> np.ndarray:
        out = np.full(bins, np.nan)
        good = ~np.isnan(t) & ~np.isnan(v)
        i = np.clip(np.searchsorted(edges, t[good], side="right") - 1, 0, bins - 1)
        np.fmax.at(out, i, v[good] * 1e3)
        return out

    curve = load.in_flight.curve
    ct = (curve["ts_ns"].to_numpy(np.float64) - origin) / 1e9
    flight = _step_mean(ct, curve["in_flight"].to_numpy(np.float64), edges)
    waiting = np.full(bins, np.nan)
    steps = data.run.steps
    if len(steps) and steps["num_waiting"].notna().any():
        st = (steps["start_ns"].to_numpy(np.float64) - origin) / 1e9
        order = np.argsort(st)
        w = steps["num_waiting"].to_numpy(dtype="float64", na_value=0.0)[order]
        waiting = _step_mean(st[order], w, edges)
    has_plan = (~np.isnan(planned_s)).any()
    return LoadSeries(
        t0_s=lo, bin_s=width, offered=per_bin(sent_s),
        planned=per_bin(planned_s) if has_plan else np.full(bins, np.nan),
        target_rps=load.offered.target_rate_rps, late_ms=worst(sent_s, late),
        wait_ms=worst(sent_s, wait), in_flight=flight, waiting=waiting,
    )  # fmt: skip


def _step_mean(t: np.ndarray, v: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time-weighted mean per bin of a step function (v[i] holds from t[i] to t[i+1])."""
    if not len(t):
        return np.full(len(edges) - 1, np.nan)
    cum = np.r_[0.0, np.cumsum(v[:-1] * np.diff(t))]  # integral up to each t[i]

    def integral(x: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 1)
        before = x < t[0]
        return np.where(before, 0.0, cum[i] + v[i] * (x - t[i]))

    area = np.diff(integral(edges))
    return area / np.diff(edges)
