"""How much a cause moves a user-facing metric, and the most severe finding it may raise.

A cause explains a part of each request's TTFT, or of each gap between tokens. Its
impact is the counterfactual: the metric with that part removed.
- `mean_gain`: 1 − mean(metric − part) / mean(metric): what the typical request pays;
- `tail_gain`: 1 − p99(metric − part) / p99(metric): what the slowest 1 % pay;
- `slo_gain` (with an SLO on that metric): the share of judged requests that miss the
  target now and would meet it without the part.

The rule, one for every latency cause (docs/triage.md):
- with an SLO on the metric: critical when the cause alone makes ≥ 20 % of requests
  miss, warning when ≥ 5 %, otherwise at most a note;
- without one: critical when removing the cause would at least halve the mean (everyone
  pays double), warning when it would cut the mean by ≥ 10 % or the p99 by ≥ 20 %,
  otherwise at most a note.
A check's own thresholds say whether it fires; this rule caps how loud it may be.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CRITICAL_MEAN_GAIN = 0.5
WARNING_MEAN_GAIN = 0.1
WARNING_TAIL_GAIN = 0.2
CRITICAL_SLO_GAIN = 0.2
WARNING_SLO_GAIN = 0.05


@dataclass(frozen=True)
class Impact:
    mean_gain: float
    tail_gain: float
    slo_gain: float | None = None  # None: no SLO on this metric

    @property
    def max_severity(self) -> str:
        if self.slo_gain is not None:
            if self.slo_gain >= CRITICAL_SLO_GAIN:
                return "critical"
            return "warning" if self.slo_gain >= WARNING_SLO_GAIN else "info"
        if self.mean_gain >= CRITICAL_MEAN_GAIN:
            return "critical"
        if self.mean_gain >= WARNING_MEAN_GAIN or self.tail_gain >= WARNING_TAIL_GAIN:
            return "warning"
        return "info"

    @property
    def strength(self) -> float:
        """One number to rank by: the larger of the two gains (or the SLO gain)."""
        if self.slo_gain is not None:
            return self.slo_gain
        return max(self.mean_gain, self.tail_gain)


NO_IMPACT = Impact(0.0, 0.0)


def impact_of(values: np.ndarray, part: np.ndarray, target_s: float | None = None) -> Impact:
    """Impact of removing `part` from each of `values` (seconds, one per request or
    gap); `target_s`: the SLO's bound on the metric, if any (per value)."""
    v = np.asarray(values, dtype=np.float64)
    rest = v - np.clip(np.nan_to_num(np.asarray(part, dtype=np.float64)), 0.0, None)
    ok = np.isfinite(v)
    v, rest = v[ok], rest[ok]
    if not len(v) or v.mean() <= 0:
        return NO_IMPACT
    mean_gain = 1.0 - rest.mean() / v.mean()
    p99 = np.percentile(v, 99)
    tail_gain = 1.0 - np.percentile(rest, 99) / p99 if p99 > 0 else 0.0
    slo = None
    if target_s is not None:
        slo = float(((v > target_s) & (rest <= target_s)).sum() / len(v))
    return Impact(float(mean_gain), float(tail_gain), slo)


def uniform_impact(share: float) -> Impact:
    """A cause that stretches every step by `share` of its time (host contention): it
    moves the mean and the tail alike."""
    s = float(share) if np.isfinite(share) else 0.0
    return Impact(s, s)
