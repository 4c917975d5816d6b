"""Speculative decoding in `compare`: acceptance and tokens per target forward beside the
end-to-end deltas, when either run recorded the spec_* counters (a run without them
shows "–": nothing is inferred for it). The speedup itself is the output throughput's
row: the same load with and without speculation."""

from __future__ import annotations

import numpy as np

from .compare_metrics import MetricDelta, make_delta

ROWS = (
    ("spec.acceptance", "draft acceptance (accepted / drafted)", "fraction", "acceptance"),
    ("spec.mean_accepted", "accepted drafts per verify", "tokens", "mean_accepted"),
    ("spec.tokens_per_forward", "tokens per target forward", "tokens", "tokens_per_forward"),
)


def spec_deltas(a, b) -> tuple[MetricDelta, ...]:
    """Rows for two ServingAnalysis results; () when neither speculated."""
    sa, sb = getattr(a, "speculative", None), getattr(b, "speculative", None)
    if sa is None and sb is None:
        return ()

    def get(s, name):
        return float(getattr(s, name)) if s is not None else np.nan

    return tuple(
        make_delta(
            key, label, unit, get(sa, name), get(sb, name), np.nan, np.nan, lower_is_better=False
        )
        for key, label, unit, name in ROWS
    )
