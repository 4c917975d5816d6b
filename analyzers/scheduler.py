"""What the scheduler put in each step, what a step costs, and what preemption cost.

Step cost model: least squares of step wall time on its composition,
    dur ≈ fixed + a·prefill_tokens + b·decode_seqs + c·context_tokens,
fitted once, then refitted without the outliers of the first fit (robust: residuals
beyond OUTLIER_SIGMAS × 1.4826 × MAD). The marginal costs price what the cache saved
and what preemption recomputed; outlier steps (a GC pause, a contended CPU, a
recompilation) are listed, since they make ITL spikes no batch explains.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .lifecycle import Lifecycle
from .steady_state import INTERNAL
from .steptime import StepTimeline, WorkWeights

NS = 1e9
OUTLIER_SIGMAS = 4.0
MIN_STEPS = 8
TRUSTED_R2 = 0.5  # a fit explaining less is not used to weigh work or price tokens


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
class StepCostModel:
    fixed_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float
    r2: float
    steps_fitted: int
    residual_sigma_s: float
    outliers: int
    trusted: bool  # r2 ≥ TRUSTED_R2: the composition explains the step times
    outlier_steps: pd.DataFrame = field(metadata=INTERNAL)  # step_id, dur_s, predicted_s

    def weights(self) -> WorkWeights:
        """Work weights for splitting shared steps (token counts unless the fit is
        trusted and prices both prefill tokens and decoding sequences positively)."""
        if not self.trusted or self.per_prefill_token_s <= 0 or self.per_decode_seq_s <= 0:
            return WorkWeights()
        return WorkWeights(self.per_prefill_token_s, self.per_decode_seq_s)

    @property
    def prefill_token_cost_s(self) -> float:
        """Seconds one prefill token costs, NaN when the fit cannot say."""
        ok = self.trusted and self.per_prefill_token_s > 0
        return self.per_prefill_token_s if ok else float("nan")


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


def fit_step_cost(comp: Composition) -> StepCostModel | None:
    """The cost model, or None with fewer than MIN_STEPS steps."""
    f = comp.per_step
    if len(f) < MIN_STEPS:
        return None
    x = np.column_stack(
        (
            np.ones(len(f)),
            f["num_prefill_tokens"].to_numpy(np.float64),
            f["num_decode_seqs"].to_numpy(np.float64),
            f["num_context_tokens"].to_numpy(np.float64),
        )
    )
    y = f["dur_s"].to_numpy()
    coef = _lstsq(x, y)
    resid = y - x @ coef
    sigma = 1.4826 * np.median(np.abs(resid - np.median(resid)))
    outlier = np.abs(resid) > OUTLIER_SIGMAS * max(sigma, 1e-12)
    if (~outlier).sum() >= MIN_STEPS and outlier.any():
        coef = _lstsq(x[~outlier], y[~outlier])
        resid = y - x @ coef
    fitted = ~outlier
    ss_res = float((resid[fitted] ** 2).sum())
    ss_tot = float(((y[fitted] - y[fitted].mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    predicted = x @ coef
    outliers = pd.DataFrame(
        {
            "step_id": f["step_id"].to_numpy()[outlier],
            "dur_s": y[outlier],
            "predicted_s": predicted[outlier],
            "num_prefill_tokens": f["num_prefill_tokens"].to_numpy()[outlier],
            "num_decode_seqs": f["num_decode_seqs"].to_numpy()[outlier],
        }
    ).sort_values("dur_s", ascending=False, ignore_index=True)
    trusted = bool(r2 >= TRUSTED_R2)
    return StepCostModel(
        fixed_s=float(coef[0]),
        per_prefill_token_s=float(coef[1]),
        per_decode_seq_s=float(coef[2]),
        per_context_token_s=float(coef[3]),
        r2=float(r2),
        steps_fitted=int(fitted.sum()),
        residual_sigma_s=float(sigma),
        outliers=int(outlier.sum()),
        trusted=trusted,
        outlier_steps=outliers,
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


def _lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Scale columns so that token counts (thousands) and the constant (1) condition alike.
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(x / scale, y, rcond=None)
    return coef / scale
