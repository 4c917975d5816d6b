"""How the end-to-end metrics moved between two runs: percentiles of TTFT, TPOT, ITL and
E2E with seeded bootstrap confidence intervals on the difference B − A (compare.py's
docstring says how requests are resampled)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .findings import value_text
from .lifecycle import Missing
from .serving import ServingAnalysis


@dataclass(frozen=True)
class MetricDelta:
    metric: str  # ttft.p50, itl.p99, throughput.output, …
    label: str
    unit: str  # ms | tokens/s | req/s
    a: float
    b: float
    delta: float  # b − a
    relative: float  # delta / a
    ci_low: float  # bootstrap interval of the delta (NaN: no interval)
    ci_high: float
    significant: bool  # the interval excludes 0
    verdict: str  # better | worse | same | unknown
    # Beside the row (compare_itl.py: ITL per chunk while chunks carry several tokens).
    note: str = ""
    # False: the verdict must not call the run better or worse on its own (per-chunk ITL
    # "worse" while TPOT, per token, improved); the row still shows it.
    decisive: bool = True

    def texts(self) -> tuple[str, str, str, str, str]:
        """A, B, the delta, the relative change and the delta's interval as text, in the
        findings' number format, for every renderer (`perfdiag compare`, the TUI)."""
        interval = ""  # none: the verdict says "no interval"
        if self.ci_low == self.ci_low:
            interval = (
                f"[{value_text(self.ci_low, '', True)}, {value_text(self.ci_high, '', True)}]"
            )
        rel = "" if self.relative != self.relative else value_text(self.relative, "%", True)
        return (
            value_text(self.a),
            value_text(self.b),
            value_text(self.delta, "", signed=True),
            rel,
            interval,
        )


_PERCENTILE_METRICS = (
    ("ttft", "TTFT", "ttft_s", (50, 90, 99)),
    ("tpot", "TPOT", "tpot_s", (50, 99)),
    ("itl", "ITL", None, (50, 99)),
    # Each request's longest gap between tokens: the stall its stream showed. A spike in
    # under 1 % of all gaps (a long prompt's prefill stalling every decode once) leaves
    # ITL p99 unmoved yet reaches most requests.
    ("stall", "worst gap per request", None, (50, 90)),
    ("e2e", "E2E", "e2e_s", (50, 99)),
    ("due_e2e", "E2E from due", "due_e2e_s", (50, 99)),  # client waits included
)
# Every metric key `metric_deltas` reports: the targets an action may name.
METRIC_KEYS = (
    *(f"{key}.p{p}" for key, _, _, ps in _PERCENTILE_METRICS for p in ps),
    "throughput.output",
    "throughput.requests",
)


def percentile_metric(metric: str) -> tuple[str, str, int] | None:
    """A percentile metric key ("ttft.p50") as (values key, label, percentile); None for
    another key."""
    key, _, p = metric.rpartition(".p")
    for k, label, _, ps in _PERCENTILE_METRICS:
        if k == key and p.isdigit() and int(p) in ps:
            return k, f"{label} p{p}", int(p)
    return None


def request_values(s: ServingAnalysis) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """Per metric: values and the request each belongs to (measured requests only)."""
    if isinstance(s.metrics, Missing):
        return None
    pr = s.metrics.per_request
    sel = pr["in_window"].to_numpy(bool)
    out = {}
    for key, _, column, _ in _PERCENTILE_METRICS:
        if column is None:
            continue
        v = pr[column].to_numpy("float64")[sel]
        ok = np.isfinite(v)
        out[key] = (v[ok], np.flatnonzero(sel)[ok])
    g = s.metrics.gaps
    gsel = sel[g["code"].to_numpy()] if len(g) else np.zeros(0, dtype=bool)
    out["itl"] = (g["gap_s"].to_numpy("float64")[gsel], g["code"].to_numpy()[gsel])
    worst = pd.Series(out["itl"][0]).groupby(out["itl"][1]).max()
    out["stall"] = (worst.to_numpy("float64"), worst.index.to_numpy())
    return out


def _bootstrap(values: np.ndarray, groups: np.ndarray, qs, n: int, rng) -> np.ndarray:
    """Percentiles `qs` of `n` resamples drawing whole groups (requests) with replacement:
    an (n, len(qs)) array."""
    if len(values) == 0:
        return np.full((n, len(qs)), np.nan)
    order = np.argsort(groups, kind="stable")
    values, groups = values[order], groups[order]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    lengths = np.diff(np.r_[starts, len(values)])
    out = np.empty((n, len(qs)))
    for i in range(n):
        pick = rng.integers(0, len(starts), len(starts))
        ln = lengths[pick]
        offsets = np.repeat(starts[pick] - np.r_[0, np.cumsum(ln)[:-1]], ln)
        out[i] = np.percentile(values[offsets + np.arange(ln.sum())], qs)
    return out


def metric_deltas(
    a: ServingAnalysis, b: ServingAnalysis, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[MetricDelta, ...]:
    va, vb = request_values(a), request_values(b)
    if va is None or vb is None:
        return ()
    rng = np.random.default_rng(seed)
    lo_q, hi_q = 50 * (1 - level), 50 * (1 + level)
    out = []
    for key, label, _, percentiles in _PERCENTILE_METRICS:
        (xa, ga), (xb, gb) = va[key], vb[key]
        diffs = _bootstrap(xb, gb, percentiles, n_boot, rng) - _bootstrap(
            xa, ga, percentiles, n_boot, rng
        )
        for j, p in enumerate(percentiles):
            pa = float(np.percentile(xa, p)) if len(xa) else np.nan
            pb = float(np.percentile(xb, p)) if len(xb) else np.nan
            ok = diffs[:, j][np.isfinite(diffs[:, j])]
            lo, hi = np.percentile(ok, [lo_q, hi_q]) if len(ok) else (np.nan, np.nan)
            out.append(
                make_delta(
                    f"{key}.p{p}",
                    f"{label} p{p}",
                    "ms",
                    pa * 1e3,
                    pb * 1e3,
                    lo * 1e3,
                    hi * 1e3,
                    lower_is_better=True,
                )
            )
    for key, label, unit, get in (
        ("throughput.output", "output throughput", "tokens/s", lambda t: t.output_tokens_per_s),
        ("throughput.requests", "request throughput", "req/s", lambda t: t.requests_per_s),
    ):
        ta, tb = get(a.metrics.throughput), get(b.metrics.throughput)
        out.append(make_delta(key, label, unit, ta, tb, np.nan, np.nan, lower_is_better=False))
    from .compare_itl import note_per_chunk_rows  # (they import this module)
    from .compare_spec import spec_deltas

    return note_per_chunk_rows((*out, *spec_deltas(a, b)), a, b)


def make_delta(metric, label, unit, a, b, lo, hi, lower_is_better: bool) -> MetricDelta:
    delta = b - a
    significant = bool(np.isfinite(lo) and np.isfinite(hi) and (lo > 0 or hi < 0))
    if not np.isfinite(delta):
        verdict = "unknown"
    elif not np.isfinite(lo):
        verdict = "unknown" if delta else "same"
    elif not significant:
        verdict = "same"
    else:
        verdict = "better" if (delta < 0) == lower_is_better else "worse"
    rel = delta / a if a and np.isfinite(a) else float("nan")
    return MetricDelta(
        metric,
        label,
        unit,
        float(a),
        float(b),
        float(delta),
        float(rel),
        float(lo),
        float(hi),
        significant,
        verdict,
    )
