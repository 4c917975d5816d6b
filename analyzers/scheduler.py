"""What the scheduler put in each step, what held waiting requests back, and what
preemption cost (the step cost model itself is in step_cost.py).

Binding limits: after each step's admission, requests still waiting were held back by
one limit — the sequence cap (`max_num_seqs`), the token budget, free KV blocks, a
preemption in the step (no admission then) or swapped requests that come back first —
or by none, when they arrived while the step ran (arrivals faster than steps). The
reference engine records which (`steps.blocked_by`); for other engines it is inferred
from the step's counts and the recorded limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .lifecycle import Lifecycle
from .steady_state import INTERNAL
from .step_cost import StepCostModel
from .steptime import StepTimeline

NS = 1e9
LIMITS = ("max_num_seqs", "token_budget", "kv_blocks", "preemption", "swapped", "none")
KV_FULL = 0.9  # a pool this full cannot admit more


@dataclass(frozen=True)
class Composition:
    steps: int
    prefill_only: int
    decode_only: int
    mixed: int
    mean_batch_seqs: float
    mean_prefill_tokens: float  # per step with prefill
    mean_decode_seqs: float  # per step with decodes
    busy_s: float  # Σ step durations
    per_step: pd.DataFrame = field(metadata=INTERNAL)


@dataclass(frozen=True)
class Preemptions:
    count: int
    recompute: int
    swap: int
    recomputed_tokens: int  # computed tokens lost and computed again (cache hits excluded)
    recompute_cost_s: float  # recomputed tokens × the fitted cost per prefill token
    swapped_tokens: int  # tokens copied out to the CPU tier and back
    waiting_s: float  # Σ preemption → the step that took the request back
    per_preemption: pd.DataFrame = field(metadata=INTERNAL)


def composition(timeline: StepTimeline) -> Composition:
    p, d = timeline.prefill_tokens, timeline.decode_seqs
    dur = (timeline.end - timeline.start) / NS
    kind = np.where((p > 0) & (d > 0), "mixed", np.where(p > 0, "prefill", "decode"))
    frame = pd.DataFrame(
        {
            "step_id": timeline.step_id,
            "dur_s": dur,
            "num_prefill_seqs": timeline.prefill_seqs,
            "num_prefill_tokens": p,
            "num_decode_seqs": d,
            "num_context_tokens": timeline.context_tokens,
            "kind": pd.Categorical(kind, categories=["prefill", "decode", "mixed"]),
        }
    )
    seqs = frame["num_prefill_seqs"].to_numpy() + d
    return Composition(
        steps=len(frame),
        prefill_only=int((kind == "prefill").sum()),
        decode_only=int((kind == "decode").sum()),
        mixed=int((kind == "mixed").sum()),
        mean_batch_seqs=float(seqs.mean()) if len(seqs) else float("nan"),
        mean_prefill_tokens=float(p[p > 0].mean()) if (p > 0).any() else 0.0,
        mean_decode_seqs=float(d[d > 0].mean()) if (d > 0).any() else 0.0,
        busy_s=float(dur.sum()),
        per_step=frame,
    )


def preemptions(
    lc: Lifecycle, timeline: StepTimeline | None, cost: StepCostModel | None
) -> Preemptions:
    """Each preemption, the step that took the request back, and what it cost."""
    e = lc.engine
    pre = e[(e["kind"] == "preempted").to_numpy()][["code", "t", "step", "num_tokens", "detail"]]
    # Taken back: re-admitted (a `scheduled` event, with its cache hits) or swapped in.
    swap_in = (e["kind"] == "resumed").to_numpy() & (e["detail"] == "swap").to_numpy()
    back = e[(e["kind"] == "scheduled").to_numpy() | swap_in]
    back = back[["code", "t", "step", "num_cached"]].rename(
        columns={"t": "t_back", "step": "step_back", "num_cached": "hits"}
    )
    joined = pd.merge_asof(
        pre.sort_values("t"), back.sort_values("t_back"), left_on="t", right_on="t_back", by="code",
        direction="forward", allow_exact_matches=False,
    )  # fmt: skip
    lost = joined["num_tokens"].fillna(0).to_numpy()
    is_swap = (joined["detail"] == "swap").to_numpy()
    hits = joined["hits"].fillna(0).to_numpy()
    recomputed = np.where(is_swap, 0.0, np.maximum(lost - hits, 0.0))
    wait = np.full(len(joined), np.nan)
    if timeline is not None and len(joined):
        pos = timeline.index_of(joined["step_back"].to_numpy())
        wait = np.where(pos >= 0, timeline.start[np.maximum(pos, 0)] - joined["t"], np.nan)
    frame = pd.DataFrame(
        {
            "request_id": lc.requests["request_id"].to_numpy()[joined["code"].to_numpy()],
            "step_id": joined["step"].to_numpy(),
            "mode": joined["detail"].astype(object).to_numpy(),
            "computed_tokens": lost,
            "cache_hits_on_return": np.where(is_swap, np.nan, hits),
            "recomputed_tokens": recomputed,
            "waiting_s": np.maximum(wait, 0.0) / NS,
        }
    )
    per_token = cost.prefill_token_cost_s if cost is not None else np.nan
    return Preemptions(
        count=len(frame),
        recompute=int((~is_swap).sum()),
        swap=int(is_swap.sum()),
        recomputed_tokens=int(recomputed.sum()),
        recompute_cost_s=float(recomputed.sum() * per_token),
        swapped_tokens=int(lost[is_swap].sum()),
        waiting_s=float(np.nansum(frame["waiting_s"])),
        per_preemption=frame,
    )


def kv_pool(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per step row: KV blocks in use and the pool's size (used + free; NaN where the
    steps table does not record them)."""
    used = steps["kv_blocks_used"].to_numpy("float64", na_value=np.nan)
    return used, used + steps["kv_blocks_free"].to_numpy("float64", na_value=np.nan)


def pool_blocks(steps: pd.DataFrame) -> int | None:
    """The KV pool's size in blocks, None when not recorded."""
    _, pool = kv_pool(steps)
    return int(np.nanmax(pool)) if np.isfinite(pool).any() else None


@dataclass(frozen=True)
class BindingLimits:
    steps_with_queue: int  # steps after whose admission requests still waited
    shares: dict[str, float]  # LIMITS → share of those steps
    source: str  # engine (recorded per step) | inferred (from counts and limits)
    max_num_seqs: int | None
    token_budget: int | None
    kv_peak_share: float  # peak share of the KV pool in use over the run
    kv_share_when_queued: float  # mean share in use in steps with a queue
    # In the steps with a queue, p90 of running + waiting (how many wanted to run at
    # once; None when running is not recorded) and of waiting alone.
    demand_p90: int | None
    waiting_p90: float
    per_step: pd.DataFrame = field(metadata=INTERNAL)  # step_id, limit (steps with a queue)

    @property
    def binding(self) -> str | None:
        """The limit that held most often (None: no step had a queue)."""
        if not self.steps_with_queue:
            return None
        return max(LIMITS, key=lambda k: self.shares.get(k, 0.0))


def binding_limits(
    steps: pd.DataFrame, cap: int | None, budget: int | None
) -> BindingLimits | None:
    """Which limit held waiting requests back in each step (`cap`: max_num_seqs,
    `budget`: max_num_batched_tokens, as recorded); None without queue depths."""
    if not len(steps) or steps["num_waiting"].isna().all():
        return None
    s = steps.drop_duplicates("step_id").sort_values("start_ns", kind="stable")
    waiting = s["num_waiting"].to_numpy("float64", na_value=0.0)
    used, pool = kv_pool(s)
    kv = np.divide(used, pool, out=np.full(len(s), np.nan), where=pool > 0)
    running = s["num_running"].to_numpy("float64", na_value=np.nan)
    recorded = "blocked_by" in s and s["blocked_by"].notna().any()
    if recorded:
        limit = s["blocked_by"].astype(object).where(s["blocked_by"].notna(), "none").to_numpy()
    else:
        tokens = (s["num_prefill_tokens"] + s["num_decode_seqs"]).to_numpy("float64")
        limit = np.full(len(s), "none", dtype=object)
        limit[np.nan_to_num(kv) >= KV_FULL] = "kv_blocks"
        if budget:
            limit[tokens >= budget] = "token_budget"
        if cap:
            limit[np.nan_to_num(running) >= cap] = "max_num_seqs"
    queued = waiting > 0
    frame = pd.DataFrame({"step_id": s["step_id"].to_numpy()[queued], "limit": limit[queued]})
    counts = frame["limit"].value_counts()
    n = int(queued.sum())
    demand = None
    if n and np.isfinite(running).any():
        demand = math.ceil(np.percentile(np.nan_to_num(running[queued]) + waiting[queued], 90))
    return BindingLimits(
        steps_with_queue=n,
        shares={k: float(counts.get(k, 0) / n) if n else 0.0 for k in LIMITS},
        source="engine" if recorded else "inferred",
        max_num_seqs=int(cap) if cap else None,
        token_budget=int(budget) if budget else None,
        kv_peak_share=float(np.nanmax(kv)) if np.isfinite(kv).any() else float("nan"),
        kv_share_when_queued=float(np.nanmean(kv[queued]))
        if queued.any() and np.isfinite(kv[queued]).any()
        else float("nan"),
        demand_p90=demand,
        waiting_p90=float(np.percentile(waiting[queued], 90)) if n else 0.0,
        per_step=frame,
    )
