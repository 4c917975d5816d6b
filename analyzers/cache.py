"""Prefix-cache hits by tier, in tokens, and the compute they saved (triage step 5).

- device tier: prompt tokens found in the GPU block pool when a request is admitted
  (`scheduled` events' num_cached_tokens): at first admission, and again when a
  recompute-preempted request comes back (its own blocks, still cached);
- swap tier: a request swapped out to the CPU and swapped back in (`resumed`, detail
  swap) gets back every token it had computed, without recomputing them.
The compute saved is those tokens priced at the step-cost model's marginal cost per
prefill token (NaN when the model cannot price them), and its share is relative to what
the steps would have taken without the cache (busy + saved).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .lifecycle import Lifecycle
from .scheduler import StepCostModel


@dataclass(frozen=True)
class TierHits:
    tier: str  # device | swap
    hit_tokens: int
    events: int  # admissions (device) or swap-ins (swap) that hit
    saved_s: float


@dataclass(frozen=True)
class CacheAnalysis:
    prompt_tokens: int  # prompts of admitted requests
    first_admission_hit_tokens: int
    hit_rate: float  # first-admission hits / prompt tokens
    requests_with_hits: int
    recompute_hit_tokens: int  # device hits when a preempted request came back
    tiers: tuple[TierHits, ...]
    saved_s: float  # all tiers
    saved_share: float  # saved / (step busy time + saved)
    cost_per_prefill_token_s: float


def cache_hits(lc: Lifecycle, cost: StepCostModel | None, busy_s: float) -> CacheAnalysis:
    e = lc.engine
    sched = e[(e["kind"] == "scheduled").to_numpy()]
    code = sched["code"].to_numpy()
    hits = np.nan_to_num(sched["num_cached"].to_numpy())
    t = sched["t"].to_numpy()
    first = t == lc.requests["t_first_sched"].to_numpy()[code]
    first_hits = np.bincount(code[first], hits[first], minlength=len(lc.requests))
    admitted = np.zeros(len(lc.requests), dtype=bool)
    admitted[code] = True
    prompt = int(np.nansum(lc.requests["prompt_tokens"].to_numpy()[admitted]))
    device_tokens = int(hits.sum())
    swap_tokens, swaps = _swap_restores(lc)
    price = cost.prefill_token_cost_s if cost is not None else float("nan")
    tiers = (
        TierHits("device", device_tokens, int((hits > 0).sum()), device_tokens * price),
        TierHits("swap", swap_tokens, swaps, swap_tokens * price),
    )
    saved = (device_tokens + swap_tokens) * price
    return CacheAnalysis(
        prompt_tokens=prompt,
        first_admission_hit_tokens=int(first_hits.sum()),
        hit_rate=float(first_hits.sum() / prompt) if prompt else float("nan"),
        requests_with_hits=int((first_hits > 0).sum()),
        recompute_hit_tokens=int(hits[~first].sum()),
        tiers=tiers,
        saved_s=float(saved),
        saved_share=float(saved / (busy_s + saved)) if busy_s + saved > 0 else float("nan"),
        cost_per_prefill_token_s=float(price),
    )


def _swap_restores(lc: Lifecycle) -> tuple[int, int]:
    """Tokens restored by swap-ins: what the request had computed when swapped out."""
    e = lc.engine
    swap = (e["detail"] == "swap").to_numpy()
    out = e[(e["kind"] == "preempted").to_numpy() & swap]
    back = e[(e["kind"] == "resumed").to_numpy() & swap]
    if len(out) == 0 or len(back) == 0:
        return 0, 0
    # Each swap-in restores the latest swap-out of the same request before it.
    joined = pd.merge_asof(
        back[["code", "t"]].sort_values("t"),
        out[["code", "t", "num_tokens"]].sort_values("t"),
        on="t",
        by="code",
        direction="backward",
    )
    return int(np.nansum(joined["num_tokens"].to_numpy())), len(back)
