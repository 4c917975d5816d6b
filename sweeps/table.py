"""A sweep's table: one row per point, each metric with a 95 % confidence interval.

- Latency percentiles pool the point's repeats (every measured request of every repeat)
  and take their interval from a two-level bootstrap: resample the repeats, then the
  requests inside each (ITL resamples whole requests with all their gaps). Run-to-run
  noise and request-to-request spread both widen it; with one repeat only the second
  remains, which the table says (`repeats` = 1).
- Per-run figures (throughput, goodput) are the mean of the repeats with a Student-t
  interval on their logarithms (none with one repeat): a rate is positive and spreads
  by ratios, and an interval on the values themselves went below zero with two
  repeats that disagree (`50.1 [-167, 267]`). A repeat at zero (no good request) has
  no logarithm: then the interval is on the values, cut at zero (a rate cannot be
  below it, so the cut keeps the interval's coverage). The SLO attainment pools the
  repeats' judged requests, with a Clopper–Pearson interval.
- The limiting cause is the triage's top cause, the most common over the repeats, with
  how many repeats agree.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from ..analyzers.bootstrap import N_BOOT, two_level_bootstrap  # noqa: F401  (re-exported)
from .measure import Measured, gap_values, request_values, row

LEVEL = 0.95
# (column, per-request field or "gap" for delivery gaps, percentile, scale)
LATENCY = (
    ("ttft_p50_ms", "ttft_s", 50, 1e3),
    ("ttft_p99_ms", "ttft_s", 99, 1e3),
    ("tpot_p50_ms", "tpot_s", 50, 1e3),
    ("tpot_p99_ms", "tpot_s", 99, 1e3),
    ("itl_p50_ms", "gap", 50, 1e3),
    ("itl_p99_ms", "gap", 99, 1e3),
    ("e2e_p50_s", "e2e_s", 50, 1.0),
    ("e2e_p99_s", "e2e_s", 99, 1.0),
)
PER_RUN = ("output_tok_s", "req_s", "sent_rate", "attainment", "goodput_req_s")
LABELS = {
    "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p99_ms": "TTFT p99 (ms)",
    "tpot_p50_ms": "TPOT p50 (ms)", "tpot_p99_ms": "TPOT p99 (ms)",
    "itl_p50_ms": "ITL p50 (ms)", "itl_p99_ms": "ITL p99 (ms)",
    "e2e_p50_s": "E2E p50 (s)", "e2e_p99_s": "E2E p99 (s)",
    "output_tok_s": "output tokens/s", "req_s": "requests/s", "sent_rate": "sent requests/s",
    "attainment": "SLO attainment", "goodput_req_s": "goodput (req/s)",
}  # fmt: skip
LOWER_IS_BETTER = {c for c, *_ in LATENCY}


def runs_table(points: list[tuple[dict[str, Any], list[Measured]]]) -> pd.DataFrame:
    """Every recorded repeat: the point's axis values, the repeat, the run's row."""
    rows = []
    for values, repeats in points:
        for i, m in enumerate(repeats):
            rows.append({**values, "repeat": i, **row(m)})
    return pd.DataFrame(rows)


def points_table(
    points: list[tuple[dict[str, Any], list[Measured]]], seed: int = 0
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for values, repeats in points:
        usable = [m for m in repeats if m.usable]
        out: dict[str, Any] = {**values, "repeats": len(usable)}
        if usable:
            measured = [row(m) for m in usable]
            out.update(_latency(usable, rng))
            out.update(per_run_intervals(measured))
            out.update(_cause(measured))
        rows.append(out)
    return pd.DataFrame(rows)


def _latency(repeats: list[Measured], rng) -> dict[str, float]:
    reqs = [request_values(m) for m in repeats]
    gaps = [gap_values(m) for m in repeats]
    out: dict[str, float] = {}
    for column, field, q, scale in LATENCY:
        if field == "gap":
            samples = [(g["gap_s"].to_numpy(), g["request"].to_numpy()) for g in gaps]
        else:
            samples = [
                (r[field].to_numpy()[np.isfinite(r[field].to_numpy())],
                 r["request"].to_numpy()[np.isfinite(r[field].to_numpy())])
                for r in reqs
            ]  # fmt: skip
        pooled = np.concatenate([v for v, _ in samples]) if samples else np.zeros(0)
        if not len(pooled):
            out[column] = out[f"{column}_lo"] = out[f"{column}_hi"] = np.nan
            continue
        boot = two_level_bootstrap(samples, q, rng)
        lo, hi = np.nanpercentile(boot, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
        out[column] = float(np.percentile(pooled, q)) * scale
        out[f"{column}_lo"], out[f"{column}_hi"] = float(lo) * scale, float(hi) * scale
    return out


def per_run_intervals(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The mean of each per-run figure over the repeats, with its 95 % interval."""
    from scipy import stats

    out: dict[str, float] = {}
    for column in PER_RUN:
        v = np.array([r.get(column, np.nan) for r in rows], dtype="float64")
        v = v[np.isfinite(v)]
        mean = float(v.mean()) if len(v) else np.nan
        lo, hi = _positive_interval(v) if len(v) >= 2 else (np.nan, np.nan)
        out[column], out[f"{column}_lo"], out[f"{column}_hi"] = mean, lo, hi
    judged = sum(int(r.get("judged", 0) or 0) for r in rows)
    if judged:
        good = sum(int(r.get("good", 0) or 0) for r in rows)
        ci = stats.binomtest(good, judged).proportion_ci(LEVEL, method="exact")
        out["attainment"] = good / judged
        out["attainment_lo"], out["attainment_hi"] = float(ci.low), float(ci.high)
    return out


def _positive_interval(v: np.ndarray) -> tuple[float, float]:
    """Student-t on the logarithms (back to the values' scale), or on the values cut at
    zero when a repeat is zero."""
    from scipy import stats

    t = stats.t.ppf(0.5 + LEVEL / 2, len(v) - 1) / np.sqrt(len(v))
    if (v > 0).all():
        logs = np.log(v)
        half = t * logs.std(ddof=1)
        return float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
    half = t * v.std(ddof=1)
    return max(float(v.mean() - half), 0.0), float(v.mean() + half)


def _cause(rows: list[dict[str, Any]]) -> dict[str, Any]:
    causes = Counter(r.get("cause", "") for r in rows)
    top, n = causes.most_common(1)[0]
    title = next((r.get("cause_title", "") for r in rows if r.get("cause") == top), "")
    qualifiers = sorted({r.get("qualifier", "") for r in rows} - {""})
    return {
        "cause": top,
        "cause_agree": f"{n}/{len(rows)}",
        "cause_title": title,
        "qualifier": ",".join(qualifiers),
    }


def separated(a: pd.Series, b: pd.Series, column: str) -> bool:
    """Whether two points' intervals on `column` do not overlap (a real difference)."""
    lo, hi = f"{column}_lo", f"{column}_hi"
    if any(pd.isna(x) for x in (a.get(lo), a.get(hi), b.get(lo), b.get(hi))):
        return False
    return bool(a[hi] < b[lo] or b[hi] < a[lo])
