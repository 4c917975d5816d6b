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

Removing a part is an upper bound no setting delivers. Where a finding's advice is a
setting whose effect the run's own models price (the step cost model for a chunk, the
limits for a queue), its impact is that prediction instead (`predicted_impact`): what
each request or gap would save with the advised value, judged on the metric the advice
targets (`ttft.p50` → the median, `itl.p99` → the 99th percentile, …): critical when the
advice is predicted to at least halve it, warning when to cut it by ≥ 10 %, otherwise a
note — a finding whose best advice gains little is information, not a warning. With an
SLO on that metric the SLO rule above applies to the predicted values. The prediction's
uncertainty is a bootstrap interval over the requests or gaps.
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
    # With an advice's prediction (predicted_impact): the metric it targets and the gain
    # on that metric, with a 95 % bootstrap interval. None: the cause's removal bound.
    target: str | None = None
    target_gain: float | None = None
    target_gain_ci: tuple[float, float] | None = None

    @property
    def max_severity(self) -> str:
        if self.slo_gain is not None:
            if self.slo_gain >= CRITICAL_SLO_GAIN:
                return "critical"
            return "warning" if self.slo_gain >= WARNING_SLO_GAIN else "info"
        if self.target_gain is not None:
            if self.target_gain >= CRITICAL_MEAN_GAIN:
                return "critical"
            return "warning" if self.target_gain >= WARNING_MEAN_GAIN else "info"
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
        if self.target_gain is not None:
            return self.target_gain
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
    return Impact(*_gains(v, rest, target_s))


def _gains(v: np.ndarray, rest: np.ndarray, target_s: float | None):
    """(mean gain, p99 gain, SLO gain) of the values `v` becoming `rest`."""
    p99 = np.percentile(v, 99)
    tail = 1.0 - np.percentile(rest, 99) / p99 if p99 > 0 else 0.0
    slo = None if target_s is None else float(((v > target_s) & (rest <= target_s)).mean())
    return float(1.0 - rest.mean() / v.mean()), float(tail), slo


def predicted_impact(
    values: np.ndarray,
    saved: np.ndarray,
    target: str,
    target_s: float | None = None,
    resamples: int = 400,
) -> Impact:
    """Impact of an advised change predicted to save `saved` of each of `values`
    (seconds), judged on `target` (an action's metric key: its statistic after the dot,
    `p50`, `p99`, `mean`, …); `target_s`: the SLO's bound on the metric, if any."""
    v = np.asarray(values, dtype=np.float64)
    cut = np.nan_to_num(np.asarray(saved, dtype=np.float64))  # < 0: the advice costs it
    ok = np.isfinite(v)
    v, cut = v[ok], np.minimum(cut[ok], np.clip(v[ok], 0.0, None))
    stat = _statistic(target)
    if not len(v) or not stat(v) > 0:
        return Impact(0.0, 0.0, None if target_s is None else 0.0, target, 0.0, (0.0, 0.0))
    rest = v - cut
    gain = 1.0 - stat(rest) / stat(v)
    rng = np.random.default_rng(0)  # the same run gives the same interval
    draws = []
    for _ in range(resamples):
        i = rng.integers(0, len(v), len(v))
        s0 = stat(v[i])
        if s0 > 0:
            draws.append(1.0 - stat(rest[i]) / s0)
    low, high = np.percentile(draws, [2.5, 97.5]) if draws else (gain, gain)
    return Impact(*_gains(v, rest, target_s), target, float(gain), (float(low), float(high)))


def _statistic(target: str):
    """The statistic a metric key names after its dot (ttft.p90 → the 90th percentile;
    mean or none → the mean)."""
    stat = target.rsplit(".", 1)[-1]
    if stat.startswith("p") and stat[1:].replace(".", "", 1).isdigit():
        q = float(stat[1:])
        return lambda x: float(np.percentile(x, q))
    return lambda x: float(np.mean(x))


def uniform_impact(share: float) -> Impact:
    """A cause that stretches every step by `share` of its time (host contention): it
    moves the mean and the tail alike."""
    s = float(share) if np.isfinite(share) else 0.0
    return Impact(s, s)
