"""Two runs side by side (triage steps 6 and 7): what changed between them, how the
end-to-end metrics moved, and whether the outputs are still the same.

- `config_diff` (compare_config.py): every setting that differs, as *variables*: an
  engine option, a workload field (the arrival's rate, cap and process separately),
  injected faults, a package or hardware difference, and the host's conditions (how
  much of the engine's step time other processes took, analyzers/host.py) when they
  differ by HOST_CHANGE. Measurement settings (probes) are listed apart — they change
  what is recorded, not what is measured — except a profiler window, which stalls the
  engine and so is a variable. Step 6 asks that one main variable changes.
- `metric_deltas` (compare_metrics.py): percentiles of TTFT, TPOT, ITL and E2E with
  bootstrap confidence intervals on the difference B − A (requests resampled with
  replacement, each run on its own; ITL resamples whole requests with all their gaps,
  since a request's gaps are not independent). Seeded: the same runs give the same
  intervals.
- `trace_diff` (analyzers/trace_diff.py): per op and kernel, what was added, removed or
  changed in calls and time per step, when both runs hold spans.
- `correctness`: per request, the output digest of B against A (same request id, both
  ended normally), the mismatch rate, and log-probability differences where recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..traces.reader import Run
from .compare_config import PROMPT_FIELDS, ConfigDiff, _show, config_diff
from .compare_metrics import (
    METRIC_KEYS,
    MetricDelta,
    make_delta,
    metric_deltas,
    percentile_metric,
    request_values,
)
from .findings import SEVERITIES, Triage
from .trace_diff import TraceDiff

# config_diff and the metric deltas live beside this module; their names stay here too.
__all__ = [
    "METRIC_KEYS", "Comparison", "ConfigDiff", "Correctness", "FindingChange", "MetricDelta",
    "config_diff", "correctness", "finding_changes", "make_delta", "metric_deltas",
    "percentile_metric", "request_values",
]  # fmt: skip


# -- correctness -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Correctness:
    comparable: bool
    reason: str  # why not comparable, or what was compared
    compared: int  # requests that ended normally in both runs
    mismatched: int
    mismatch_rate: float
    length_mismatched: int  # of the mismatches, those whose output lengths differ
    mismatched_ids: tuple[str, ...]
    logprobs: str  # what the log-probability check could do
    max_logprob_diff: float


def correctness(a: Run, b: Run) -> Correctness:
    wa = (a.manifest.config.get("run_options") or {}).get("workload")
    wb = (b.manifest.config.get("run_options") or {}).get("workload")
    if isinstance(wa, dict) and isinstance(wb, dict):
        differ = [k for k in PROMPT_FIELDS if _show(wa.get(k)) != _show(wb.get(k))]
        if differ:
            reason = f"the runs send different requests (workload {', '.join(differ)} differ)"
            return Correctness(False, reason, 0, 0, float("nan"), 0, (), "not compared", np.nan)
    cols = ["request_id", "finish_reason", "output_tokens", "output_digest", "args"]
    ra, rb = a.requests[cols], b.requests[cols]
    pairs = ra.merge(rb, on="request_id", suffixes=("_a", "_b"))
    ok = (
        pairs["finish_reason_a"].isin(["stop", "length"]).to_numpy()
        & pairs["finish_reason_b"].isin(["stop", "length"]).to_numpy()
    )
    ok &= pairs["output_digest_a"].notna().to_numpy() & pairs["output_digest_b"].notna().to_numpy()
    pairs = pairs[ok]
    if not len(pairs):
        return Correctness(
            False,
            "no request ended normally in both runs with an output digest",
            0,
            0,
            float("nan"),
            0,
            (),
            "not compared",
            np.nan,
        )
    differs = (pairs["output_digest_a"] != pairs["output_digest_b"]).to_numpy()
    lengths = (pairs["output_tokens_a"] != pairs["output_tokens_b"]).to_numpy(bool, na_value=False)
    logprobs, max_diff = _logprob_diff(pairs)
    ids = tuple(pairs["request_id"].astype(str).to_numpy()[differs][:10])
    n = len(pairs)
    return Correctness(
        True,
        f"{n} requests that ended normally in both runs",
        n,
        int(differs.sum()),
        float(differs.mean()),
        int((differs & lengths).sum()),
        ids,
        logprobs,
        max_diff,
    )


def _logprob_diff(pairs: pd.DataFrame) -> tuple[str, float]:
    """|Δ| of a request's summed output log-probability, where both runs recorded one
    (`args.cumulative_logprob`)."""

    def read(text) -> float:
        try:
            value = json.loads(text).get("cumulative_logprob") if isinstance(text, str) else None
        except (json.JSONDecodeError, AttributeError):
            value = None
        return float(value) if isinstance(value, int | float) else np.nan

    la = np.array([read(t) for t in pairs["args_a"]])
    lb = np.array([read(t) for t in pairs["args_b"]])
    both = np.isfinite(la) & np.isfinite(lb)
    if not both.any():
        return "not recorded", float("nan")
    diff = np.abs(la[both] - lb[both])
    return f"{int(both.sum())} requests: max |Δ| {diff.max():.3g}", float(diff.max())


# -- findings that appeared or disappeared ---------------------------------------------------
@dataclass(frozen=True)
class FindingChange:
    check: str
    title: str
    status: str  # appeared | disappeared | worse | better
    severity_a: str | None
    severity_b: str | None


def finding_changes(a: Triage, b: Triage) -> tuple[FindingChange, ...]:
    """Warnings and critical findings in one triage and not the other, or at another
    severity (the data-trust gate included; steps 6 and 7 left out: they compare)."""

    def index(t: Triage) -> dict:
        return {f.check: f for f in t.findings if f.severity != "info" and f.step < 6}

    fa, fb = index(a), index(b)
    out = []
    for check in [*fa, *(c for c in fb if c not in fa)]:
        x, y = fa.get(check), fb.get(check)
        if x is None or y is None:
            out.append(
                FindingChange(
                    check,
                    (y or x).title,
                    "appeared" if x is None else "disappeared",
                    x and x.severity,
                    y and y.severity,
                )
            )
        elif x.severity != y.severity:
            worse = SEVERITIES.index(y.severity) > SEVERITIES.index(x.severity)
            out.append(
                FindingChange(
                    check, y.title, "worse" if worse else "better", x.severity, y.severity
                )
            )
    return tuple(out)


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    diff: ConfigDiff
    deltas: tuple[MetricDelta, ...]
    correctness: Correctness
    findings: tuple[FindingChange, ...]
    triage: Triage  # run B's triage against A as its baseline (steps 6 and 7 included)
    trace: TraceDiff | None = None  # the spans' diff, when both runs hold a trace
