"""What prefill interference in the ITL tail would be with balanced data-parallel routing
(issue 35): the model by which `dp-imbalance` explains `itl-prefill-interference`.

The ITL analysis follows one replica, the busiest (analyzers/steptime.py). A decode gap
there meets others' prefill when a prompt is prefilled in (or between) its steps; at the
loads a replica serves, the chance of that is proportional to the rate of prefill work
routed to the replica. Routing the work evenly changes that rate by

    k = (1 / replicas) / (the followed replica's share of the prompt tokens)

(k < 1 on an overloaded replica), while each prefill's cost per gap stays what it was
(prompt lengths and chunking do not change with routing). So the gaps that met a
prefill are reweighted from their share p to min(1, k·p), the rest to 1 − that, and the
check's own measure is taken again: the interference's share of the worst 1 % of gaps,
0 when that tail would no longer stand out from the median as `itl_tail_share` demands.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..analyzers.replicas import analyze_replicas, busiest_replica
from .facts import TriageContext, ev


def balanced_evidence(ctx: TriageContext, per_gap, p50_s, min_ratio, min_excess_ms) -> tuple:
    """For a data-parallel run: k and the check's value predicted with an even split,
    as `without_dp_imbalance` (evaluate.py reads `without_<root>` as what a check would
    measure once that root is fixed). () for a run of one engine."""
    k = prefill_rate_factor(ctx)
    if k is None:
        return ()
    value = balanced_tail_share(per_gap, k, p50_s, min_ratio, min_excess_ms)
    return (
        ev("balanced_factor", "its prefill rate with an even split, × now", k),
        ev("without_dp_imbalance", "interference share of the tail then (model)", value, "%"),
    )


def prefill_rate_factor(ctx: TriageContext) -> float | None:
    """k: the followed replica's prefill rate with an even split over its rate now (None
    for a run of one engine, or without prompt tokens)."""
    replica = busiest_replica(ctx.run.steps)
    if replica is None:
        return None
    if "replicas" not in ctx.memo:  # shared with facts_replicas
        ctx.memo["replicas"] = analyze_replicas(ctx.run)
    a = ctx.memo["replicas"]
    if a is None:
        return None
    prompts = a.per_replica.set_index("replica")["prompt_tokens"]
    total = float(prompts.sum())
    if replica not in prompts.index or total <= 0 or prompts[replica] <= 0:
        return None
    return (1.0 / a.replicas) / (float(prompts[replica]) / total)


def balanced_tail_share(
    per_gap: pd.DataFrame, k: float, p50_s: float, min_ratio: float, min_excess_ms: float
) -> float:
    """The interference's share of the ITL tail with the prefill rate scaled by k."""
    if not len(per_gap) or not np.isfinite(k):
        return float("nan")
    gap = per_gap["gap_s"].to_numpy("float64")
    part = np.nan_to_num(per_gap["interference_s"].to_numpy("float64"))
    net = gap - np.nan_to_num(per_gap["probe_s"].to_numpy("float64"))  # as itl.py's tail
    hit = part > 0
    p = hit.mean()
    if p == 0:
        return 0.0
    q = min(1.0, k * p)
    w = np.where(hit, q / p, (1 - q) / (1 - p) if p < 1 else 0.0)
    tail = net >= _weighted_percentile(net, w, 99.0)
    wt = w[tail]
    if wt.sum() <= 0:
        return 0.0
    tail_gap = float((wt * gap[tail]).sum() / wt.sum())
    spiky = (
        p50_s > 0 and tail_gap >= min_ratio * p50_s and (tail_gap - p50_s) * 1e3 >= min_excess_ms
    )
    return float((wt * part[tail]).sum() / (wt * gap[tail]).sum()) if spiky else 0.0


def _weighted_percentile(x: np.ndarray, w: np.ndarray, pct: float) -> float:
    """np.percentile's cut with weights: the first x whose weight below reaches pct % of
    (total − a mean weight), as position h = q·(n − 1) does with unit weights."""
    order = np.argsort(x, kind="stable")
    below = np.cumsum(w[order]) - w[order]
    at = np.searchsorted(below, pct / 100.0 * (w.sum() - w.mean()), side="left")
    return float(x[order][min(at, len(x) - 1)])
