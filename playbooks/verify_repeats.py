"""Advice judged over repeated runs (`--verify-advice --repeats N`): N runs a side, the
same options and workload seed within a side, so what differs between a side's runs is
run-to-run noise (scheduling, the machine), which one run cannot show.

The target percentile pools each side's measured requests; its 95 % interval comes from
the two-level bootstrap `sweep` uses (sweeps/table.py: resample the runs, then the
requests within each — ITL whole requests with all their gaps). The change B − A is
judged by the difference of independent resamples of the two sides. "better"/"worse"
only when that interval excludes zero *and* the two sides' own intervals do not overlap:
a change that run-to-run noise could make is "same" (the verdict: inconclusive).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analyzers.compare import MetricDelta, make_delta, percentile_metric, request_values

LEVEL = 0.95
Samples = list[tuple[np.ndarray, np.ndarray]]  # per run: values (s) and their request ids


@dataclass(frozen=True)
class RunsDelta:
    delta: MetricDelta  # A and B pooled over their runs, the interval of B − A over runs
    a_interval: tuple[float, float]  # each side's own 95 % interval (the metric's unit)
    b_interval: tuple[float, float]
    runs: tuple[int, int]  # runs on side A, side B

    @property
    def overlap(self) -> bool:
        (alo, ahi), (blo, bhi) = self.a_interval, self.b_interval
        if not all(np.isfinite(x) for x in (alo, ahi, blo, bhi)):
            return True
        return not (ahi < blo or bhi < alo)

    @property
    def verdict(self) -> str:
        """better | worse | same (the sides overlap or the change's interval holds 0) |
        unknown (no interval)."""
        if self.delta.verdict in ("better", "worse") and self.overlap:
            return "same"
        return self.delta.verdict


def samples_of(contexts, metric: str) -> Samples | None:
    """Per run, the target's values and request ids (None: not a percentile metric)."""
    known = percentile_metric(metric)
    if known is None:
        return None
    out = []
    for ctx in contexts:
        values = request_values(ctx.serving)
        if values is not None:
            out.append(values[known[0]])
    return out


def runs_delta(metric: str, a: Samples, b: Samples, seed: int = 0) -> RunsDelta | None:
    """The change of a percentile metric from side A's runs to side B's (ms)."""
    from ..analyzers.bootstrap import two_level_bootstrap as two_level  # the sweep's

    known = percentile_metric(metric)
    a = [(v, g) for v, g in a if len(v)]
    b = [(v, g) for v, g in b if len(v)]
    if known is None or not a or not b:
        return None
    _, label, q = known
    rng = np.random.default_rng(seed)
    boot_a, boot_b = two_level(a, q, rng) * 1e3, two_level(b, q, rng) * 1e3
    tails = [50 * (1 - LEVEL), 50 * (1 + LEVEL)]

    def interval(x: np.ndarray) -> tuple[float, float]:
        x = x[np.isfinite(x)]
        return tuple(float(v) for v in np.percentile(x, tails)) if len(x) else (np.nan, np.nan)

    pooled_a = float(np.percentile(np.concatenate([v for v, _ in a]), q)) * 1e3
    pooled_b = float(np.percentile(np.concatenate([v for v, _ in b]), q)) * 1e3
    lo, hi = interval(boot_b - boot_a)
    delta = make_delta(metric, label, "ms", pooled_a, pooled_b, lo, hi, lower_is_better=True)
    return RunsDelta(delta, interval(boot_a), interval(boot_b), (len(a), len(b)))
