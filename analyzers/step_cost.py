"""The run's step cost model: what each engine step should have cost, from its batch.

    dur ≈ fixed + s·prefill_chunks + a·prefill_tokens + b·decode_seqs + c·context_tokens

fitted robustly (Huber's M-estimator by iteratively reweighted least squares, scale from
the median absolute deviation), so that a few stalled steps — a GC pause, a contended
CPU, a profiler starting — neither bend the per-unit costs nor hide. The terms kept are
the subset whose prices all come out non-negative (no batch makes a step cheaper by
holding more work) that Schwarz's criterion prefers: a run whose chunks are all alike
cannot tell a chunk's cost from its tokens', and then keeps one of them.

`s` is what each prompt's chunk in a step costs beyond its tokens (its own attention
call, positions, masks): a prompt cut into n chunks pays it n times, so it is part of
the price of slicing, not of the prompt.

Every attribution uses the model. A step's measured time splits into
- `fixed`: what any step costs (scheduling, launches, weights read once),
- `prefill`: its prefill chunks and tokens (s, a), of which `chunk` is the chunks' part,
- `decode`: its decoding sequences and the context they read (b, c),
- `residual`: measured − predicted, kept apart only for *inflated* steps, whose residual
  exceeds INFLATED_SIGMAS robust standard deviations and INFLATED_SHARE of the
  prediction. In every other step the residual is noise, and the three parts are scaled
  to the measured time.
The residual is never charged to prefill or decode: an inflated step is its own cause,
explained elsewhere (analyzers/host.py) by what the run recorded at that moment.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .steady_state import INTERNAL
from .steptime import StepTimeline, WorkWeights

NS = 1e9
MIN_STEPS = 8
HUBER_K = 1.345  # Huber's constant: 95 % efficiency on Gaussian noise
INFLATED_SIGMAS = 3.0
INFLATED_SHARE = 0.2  # and at least this much above the prediction
TRUSTED_R2 = 0.5
TRUSTED_REL_ERROR = 0.15  # or: the median step is predicted this well
TERMS = ("fixed", "prefill_chunks", "prefill_tokens", "decode_seqs", "context_tokens")
OUTLIER_COLUMNS = ("step_id", "dur_s", "predicted_s", "residual_s", "num_prefill_tokens",
                   "num_decode_seqs")  # fmt: skip


@dataclass(frozen=True)
class StepCostModel:
    fixed_s: float
    per_prefill_chunk_s: float  # per prompt chunk in a step, beyond its tokens
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float
    terms: tuple[str, ...]  # the terms kept (see the module docstring)
    r2: float  # over the steps that are not inflated
    median_rel_error: float  # median |measured − predicted| / predicted
    residual_sigma_s: float  # robust (1.4826 × MAD)
    steps_fitted: int  # steps with full weight in the final fit
    outliers: int  # inflated steps
    inflated_s: float  # Σ residual of the inflated steps
    busy_s: float  # Σ step time
    trusted: bool  # the composition explains the step times (r2 or median error)
    outlier_steps: pd.DataFrame = field(metadata=INTERNAL)  # the inflated steps, worst first
    per_step: pd.DataFrame = field(metadata=INTERNAL)  # parts of every step (seconds)

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

    @property
    def inflated_share(self) -> float:
        return self.inflated_s / self.busy_s if self.busy_s > 0 else float("nan")

    @property
    def slice_cost_s(self) -> float:
        """What one more step of a sliced prompt costs beyond its tokens: a step's fixed
        cost plus a chunk's."""
        return self.fixed_s + self.per_prefill_chunk_s

    def predict_s(self, prefill_tokens=0.0, decode_seqs=0.0, context_tokens=0.0, chunks=0.0):
        """Predicted step time of a batch (arrays broadcast)."""
        return (
            self.fixed_s
            + self.per_prefill_chunk_s * np.asarray(chunks, dtype=np.float64)
            + self.per_prefill_token_s * np.asarray(prefill_tokens, dtype=np.float64)
            + self.per_decode_seq_s * np.asarray(decode_seqs, dtype=np.float64)
            + self.per_context_token_s * np.asarray(context_tokens, dtype=np.float64)
        )


def fit_step_cost(timeline: StepTimeline | None) -> StepCostModel | None:
    """The cost model of the steps, or None with fewer than MIN_STEPS steps."""
    if timeline is None or len(timeline) < MIN_STEPS:
        return None
    x = np.column_stack(
        (
            np.ones(len(timeline)),
            timeline.prefill_seqs,
            timeline.prefill_tokens,
            timeline.decode_seqs,
            timeline.context_tokens,
        )
    )
    y = (timeline.end - timeline.start) / NS
    present = np.abs(x[:, 1:]).max(axis=0) > 0  # a term no step has carries no cost
    subsets = {(True, *(a & b for a, b in zip(pick, present, strict=True)))
               for pick in itertools.product((False, True), repeat=len(present))}  # fmt: skip
    fits = {}  # kept columns → (prices, Huber weights)
    for subset in subsets:
        coef_kept, weight = huber_fit(x[:, list(subset)], y)
        # No batch makes a step cheaper by holding more work, and no step costs less
        # than nothing: every price, the fixed one too, is >= 0.
        if not (coef_kept < 0).any():
            fits[subset] = (coef_kept, weight)

    def resid(subset) -> np.ndarray:
        return y - x[:, list(subset)] @ fits[subset][0]

    # One robust scale for every candidate (the fullest fit's), so their losses compare.
    scale = max(_mad(resid(max(fits, key=sum))), 1e-12)
    best = min(fits, key=lambda k: (_robust_bic(resid(k), scale, sum(k)), sum(k)))
    keep = np.array(best)
    coef_kept, weight = fits[best]
    coef = np.zeros(x.shape[1])
    coef[keep] = coef_kept
    return _model(timeline, x, y, coef, keep, weight)


def _robust_bic(resid: np.ndarray, scale: float, terms: int) -> float:
    """Schwarz's criterion on Huber's loss: which terms the steps can tell apart (more
    terms always fit a little better; each must pay log n to stay). Every step counts,
    the few prefill steps among many decodes too, and none counts more than linearly."""
    u = np.abs(resid) / scale
    loss = np.where(u <= HUBER_K, 0.5 * u**2, HUBER_K * u - 0.5 * HUBER_K**2).sum()
    return 2.0 * float(loss) + terms * math.log(len(resid))


def huber_fit(x: np.ndarray, y: np.ndarray, iters: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Huber M-estimate of y ≈ x·coef by IRLS; returns (coef, final weights)."""
    coef = _lstsq(x, y, np.ones(len(y)))
    w = np.ones(len(y))
    for _ in range(iters):
        r = y - x @ coef
        scale = _mad(r)
        if scale <= 0:
            break
        u = np.abs(r) / (HUBER_K * scale)
        w = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
        new = _lstsq(x, y, w)
        done = np.allclose(new, coef, rtol=1e-7, atol=1e-12)
        coef = new
        if done:
            break
    return coef, w


def _model(timeline, x, y, coef, keep, weight) -> StepCostModel:
    fixed = np.full(len(y), coef[0])
    chunk = coef[1] * x[:, 1]
    prefill = chunk + coef[2] * x[:, 2]
    decode = coef[3] * x[:, 3] + coef[4] * x[:, 4]
    predicted = fixed + prefill + decode
    resid = y - predicted
    sigma = _mad(resid)
    inflated = (resid > INFLATED_SIGMAS * sigma) & (resid > INFLATED_SHARE * predicted)
    # Outside inflated steps the residual is noise: scale the parts to the measured time.
    scale = np.where(inflated | (predicted <= 0), 1.0, y / np.where(predicted > 0, predicted, 1))
    no_model = predicted <= 0  # degenerate fit: the whole step is overhead
    fixed = np.where(no_model, y, fixed * scale)
    prefill, decode = np.where(no_model, 0, prefill * scale), np.where(no_model, 0, decode * scale)
    chunk = np.where(no_model, 0, chunk * scale)
    residual = np.where(inflated, resid, 0.0)
    fitted = ~inflated
    ss_res = float((resid[fitted] ** 2).sum())
    ss_tot = float(((y[fitted] - y[fitted].mean()) ** 2).sum()) if fitted.any() else 0.0
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    rel = np.abs(resid) / np.where(predicted > 0, predicted, np.nan)
    rel_err = float(np.nanmedian(rel)) if np.isfinite(rel).any() else float("nan")
    per_step = pd.DataFrame(
        {
            "step_id": timeline.step_id,
            "dur_s": y,
            "predicted_s": predicted,
            "fixed_s": fixed,
            "prefill_s": prefill,
            "chunk_s": chunk,  # of prefill_s
            "decode_s": decode,
            "residual_s": residual,
            "inflated": inflated,
            "num_prefill_tokens": x[:, 2],
            "num_decode_seqs": x[:, 3],
        }
    )
    outliers = per_step[inflated].sort_values("residual_s", ascending=False, ignore_index=True)
    trusted = bool(r2 >= TRUSTED_R2 or rel_err <= TRUSTED_REL_ERROR)
    return StepCostModel(
        fixed_s=float(coef[0]),
        per_prefill_chunk_s=float(coef[1]),
        per_prefill_token_s=float(coef[2]),
        per_decode_seq_s=float(coef[3]),
        per_context_token_s=float(coef[4]),
        terms=tuple(t for t, k in zip(TERMS, keep, strict=True) if k),
        r2=float(r2),
        median_rel_error=rel_err,
        residual_sigma_s=float(sigma),
        steps_fitted=int((weight >= 1.0).sum()),
        outliers=int(inflated.sum()),
        inflated_s=float(residual.sum()),
        busy_s=float(y.sum()),
        trusted=trusted,
        outlier_steps=outliers[list(OUTLIER_COLUMNS)],
        per_step=per_step,
    )


def _mad(r: np.ndarray) -> float:
    return float(1.4826 * np.median(np.abs(r - np.median(r)))) if len(r) else 0.0


def _lstsq(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    # Scale columns so that token counts (thousands) and the constant (1) condition alike.
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    sw = np.sqrt(w)[:, None]
    coef, *_ = np.linalg.lstsq(x / scale * sw, y * sw[:, 0], rcond=None)
    return coef / scale
