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

Pricing (what a setting would change) uses whichever of this additive model and the
hardware-shaped one (step_cost_roofline.py) predicts held-back steps better: every
HOLDOUT_FOLDS-th step is held back in turn, both are refitted on the rest, and the
error is the mean over step kinds (with prefill, without) of the median |measured −
predicted| / predicted. The roofline model is chosen only when its error is below
ROOFLINE_MARGIN × the additive's. The parts of a step above stay additive.

An advised slice (`finest_slice`) is priced with its uncertainty: a step's fixed cost is
an extrapolation to a step holding nothing, which a run whose steps nearly all carry the
same decodes cannot pin (the constant and the decodes' price trade off). The price is
raised to its SLICE_PRICE_QUANTILE over refits on steps drawn with replacement, with
every term some step carries (which terms Schwarz keeps is itself uncertain there). Only
the additive model's price: the roofline's comes from the device's terms, not refitted.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import pandas as pd

from .steady_state import INTERNAL
from .step_cost_roofline import Hardware, RooflineFit, fit_roofline
from .steptime import StepTimeline, WorkWeights

NS = 1e9
MIN_STEPS = 8
HUBER_K = 1.345  # Huber's constant: 95 % efficiency on Gaussian noise
INFLATED_SIGMAS = 3.0
INFLATED_SHARE = 0.2  # and at least this much above the prediction
TRUSTED_R2 = 0.5
TRUSTED_REL_ERROR = 0.15  # or: the median step is predicted this well
HOLDOUT_FOLDS = 5
CHOICE_STEPS = 1000
ROOFLINE_MARGIN = 0.9  # the additive model stays unless the roofline is clearly better
SLICE_STEP = 16  # slices are advised in multiples of this many tokens
# A slice's price is advised at this quantile of its refits (bootstrap over steps): where
# most steps carry the same decodes, a step's fixed cost is an extrapolation to none, and
# identical runs priced it 1.5-16 ms (advised chunks 32-256, predicted gains 14-69 %).
SLICE_PRICE_QUANTILE = 0.9
SLICE_BOOTSTRAP = 40
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
    jit_compile_steps: int  # steps left out of the fit: they JIT-compiled a kernel
    inflated_s: float  # Σ residual of the inflated steps
    busy_s: float  # Σ step time
    trusted: bool  # the composition explains the step times (r2 or median error)
    outlier_steps: pd.DataFrame = field(metadata=INTERNAL)  # the inflated steps, worst first
    per_step: pd.DataFrame = field(metadata=INTERNAL)  # parts of every step (seconds)
    # Which model prices changes ("additive" | "roofline"), and both held-out errors.
    chosen: str = "additive"
    roofline_kind: str | None = None  # physics | hinge; None: no roofline fit
    additive_heldout_error: float = float("nan")
    roofline_heldout_error: float = float("nan")
    roofline_token_s: float = float("nan")  # mean cost of a prefill token, roofline-priced
    typical_slice_tokens: float = float("nan")  # median prefill tokens per chunk
    roofline: RooflineFit | None = field(default=None, metadata=INTERNAL)
    # For the slice price's refits (run only when a slice is advised): at most
    # CHOICE_STEPS fitted steps' columns — every column some step carries — and times,
    # and which columns those are.
    design: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, metadata=INTERNAL, compare=False, repr=False
    )

    def weights(self) -> WorkWeights:
        """Work weights for splitting shared steps (token counts unless the fit is
        trusted and prices both prefill tokens and decoding sequences positively)."""
        if not self.trusted or self.per_prefill_token_s <= 0 or self.per_decode_seq_s <= 0:
            return WorkWeights()
        return WorkWeights(self.per_prefill_token_s, self.per_decode_seq_s)

    @property
    def prefill_token_cost_s(self) -> float:
        """Seconds one prefill token costs (the chosen model's mean over the run's prefill
        steps), NaN when the fit cannot say."""
        price = self.roofline_token_s if self.chosen == "roofline" else self.per_prefill_token_s
        ok = self.trusted and price > 0
        return price if ok else float("nan")

    @property
    def priced_by(self) -> str:
        """Which model prices changes, for findings to say."""
        other = "additive" if self.chosen == "roofline" else "roofline"
        mine = self.roofline_heldout_error if self.chosen == "roofline" else (
            self.additive_heldout_error)  # fmt: skip
        theirs = self.additive_heldout_error if self.chosen == "roofline" else (
            self.roofline_heldout_error)  # fmt: skip
        name = f"roofline ({self.roofline_kind})" if self.chosen == "roofline" else "additive"
        text = f"the {name} step cost model (held-out error {_pct(mine)}"
        text += f"; {other} {_pct(theirs)}" if np.isfinite(theirs) else ""
        if self.jit_compile_steps:
            text += f"; {self.jit_compile_steps} steps that JIT-compiled a kernel left out"
        return text + ")"

    @property
    def inflated_share(self) -> float:
        return self.inflated_s / self.busy_s if self.busy_s > 0 else float("nan")

    @property
    def slice_cost_s(self) -> float:
        """What one more step of a sliced prompt costs beyond its tokens: additive, a
        step's fixed cost plus a chunk's; roofline, `slice_price_s` at the run's typical
        slice (below the ridge a slice also pays the weights' read)."""
        if self.chosen == "roofline" and np.isfinite(self.typical_slice_tokens):
            return float(self.slice_price_s(self.typical_slice_tokens))
        return self.fixed_s + self.per_prefill_chunk_s

    def slice_price_s(self, tokens, decode_seqs=0.0, context_tokens=0.0):
        """What cutting 2 × `tokens` of prompt into two slices instead of one costs: the
        extra step minus the work moved to it, cost(2 steps of n) − cost(1 step of 2n),
        beside `decode_seqs` decodes reading `context_tokens` (arrays broadcast)."""
        first = self.predict_s(tokens, decode_seqs, context_tokens, 1.0)
        # the second slice attends to the first (physics counts those pairs)
        second = self.predict_s(tokens, decode_seqs, context_tokens, 1.0, cached_tokens=tokens)
        whole = self.predict_s(2 * np.asarray(tokens, np.float64), decode_seqs, context_tokens, 1.0)
        return first + second - whole

    def token_cost_s(self, tokens, decode_seqs=0.0, context_tokens=0.0, with_chunk=False):
        """What a prompt chunk's `tokens` add to a step (`with_chunk`: and the chunk's own
        cost, s). On a GPU below the ridge, next to nothing."""
        return self.predict_s(tokens, decode_seqs, context_tokens, 1.0) - self.predict_s(
            0.0, decode_seqs, context_tokens, 0.0 if with_chunk else 1.0
        )

    def prefill_time_s(self, prompt_tokens, slice_tokens, decode_seqs=0.0):
        """Step time a prompt of `prompt_tokens` (array) spends in its prefill steps when
        cut into slices of `slice_tokens`: its full slices and the remainder, each a step
        beside `decode_seqs` decodes."""
        n = np.asarray(prompt_tokens, np.float64)
        full, rest = np.floor(n / slice_tokens), np.mod(n, slice_tokens)
        step = self.predict_s(float(slice_tokens), decode_seqs, 0.0, 1.0)
        tail = np.where(rest > 0, self.predict_s(rest, decode_seqs, 0.0, 1.0), 0.0)
        return full * step + tail

    def finest_slice(self, overhead_share: float, limit: int = 1 << 16, decode_seqs=0.0):
        """The smallest slice (a multiple of SLICE_STEP tokens, at most `limit`) whose
        slicing overhead, priced with its uncertainty (`slice_price_margin_s`), is at most
        `overhead_share` of its tokens' cost; None if none."""
        sizes = np.arange(SLICE_STEP, max(limit, SLICE_STEP) + 1, SLICE_STEP, dtype=np.float64)
        price = self.slice_price_s(sizes, decode_seqs) + self.slice_price_margin_s()
        ok = price <= overhead_share * self.token_cost_s(sizes, decode_seqs)
        return int(sizes[np.argmax(ok)]) if ok.any() else None

    def slice_price_margin_s(self) -> float:
        """How much more than its estimate a slice's fixed price (a step's fixed cost plus a
        chunk's) may be: its SLICE_PRICE_QUANTILE over SLICE_BOOTSTRAP refits with every
        term some step carries, on steps drawn with replacement, less the estimate (0
        without the steps, and when the roofline prices: the additive fit's spread says
        nothing of its terms). Deterministic for a run (a fixed seed)."""
        return self._additive_margin_s if self.chosen == "additive" else 0.0

    @cached_property  # the refits, once per model (a replaced model refits)
    def _additive_margin_s(self) -> float:
        return _slice_price_margin(self)

    def predict_s(self, prefill_tokens=0.0, decode_seqs=0.0, context_tokens=0.0, chunks=0.0,
                  cached_tokens=0.0):  # fmt: skip
        """Predicted step time of a batch by the chosen model (arrays broadcast).
        `cached_tokens`: context before each prompt chunk (the physics roofline's
        attention pairs; the other forms have no such term)."""
        if self.chosen == "roofline" and self.roofline is not None:
            got = self.roofline.predict_s(prefill_tokens, decode_seqs, context_tokens, chunks,
                                          cached_tokens)  # fmt: skip
            shape = np.broadcast_shapes(
                *(np.shape(v) for v in (prefill_tokens, decode_seqs, context_tokens, chunks))
            )
            return got.reshape(shape) if shape else float(got[0])
        return self.additive_predict_s(prefill_tokens, decode_seqs, context_tokens, chunks)

    def additive_predict_s(self, prefill_tokens=0.0, decode_seqs=0.0, context_tokens=0.0,
                           chunks=0.0):  # fmt: skip
        """Predicted step time of a batch by the additive fit (arrays broadcast)."""
        return (
            self.fixed_s
            + self.per_prefill_chunk_s * np.asarray(chunks, dtype=np.float64)
            + self.per_prefill_token_s * np.asarray(prefill_tokens, dtype=np.float64)
            + self.per_decode_seq_s * np.asarray(decode_seqs, dtype=np.float64)
            + self.per_context_token_s * np.asarray(context_tokens, dtype=np.float64)
        )


def fit_step_cost(
    timeline: StepTimeline | None, hardware: Hardware | None = None
) -> StepCostModel | None:
    """The cost model of the steps, or None with fewer than MIN_STEPS steps that did not
    JIT-compile a kernel. `hardware` (step_cost_roofline.hardware_of): the roofline's
    terms from the model and device."""
    if timeline is None:
        return None
    # A step that compiled a kernel is a warm-up cost, not its batch's: fitted on, a few
    # such steps set the price of a prefill on a GPU (jit_compile.py). They stay in the
    # model's per-step parts, as inflated steps.
    compiled = timeline.compiled if timeline.compiled is not None else np.zeros(len(timeline), bool)
    fit = ~compiled
    if fit.sum() < MIN_STEPS:
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
    xf, yf = x[fit], y[fit]
    present = np.abs(xf[:, 1:]).max(axis=0) > 0  # a term no step has carries no cost
    subsets = {(True, *(a & b for a, b in zip(pick, present, strict=True)))
               for pick in itertools.product((False, True), repeat=len(present))}  # fmt: skip
    fits = {}  # kept columns → (prices, Huber weights)
    for subset in subsets:
        coef_kept, weight = huber_fit(xf[:, list(subset)], yf)
        # No batch makes a step cheaper by holding more work, and no step costs less
        # than nothing: every price, the fixed one too, is >= 0.
        if not (coef_kept < 0).any():
            fits[subset] = (coef_kept, weight)

    def resid(subset) -> np.ndarray:
        return yf - xf[:, list(subset)] @ fits[subset][0]

    # One robust scale for every candidate (the fullest fit's), so their losses compare.
    scale = max(_mad(resid(max(fits, key=sum))), 1e-12)
    best = min(fits, key=lambda k: (_robust_bic(resid(k), scale, sum(k)), sum(k)))
    keep = np.array(best)
    coef_kept, weight_fit = fits[best]
    coef = np.zeros(x.shape[1])
    coef[keep] = coef_kept
    weight = np.zeros(len(y))
    weight[fit] = weight_fit
    model = _model(timeline, x, y, coef, keep, weight, compiled)
    # the refits of a slice's price keep every term some step carries (module docstring)
    full, rows = np.array((True, *present)), _evenly(len(yf))
    return replace(
        _choose(model, timeline, x, y, keep, hardware, fit),
        design=(xf[rows][:, full], yf[rows], full),
    )


def _evenly(n: int) -> np.ndarray:
    """At most CHOICE_STEPS of n rows, evenly spread (a long run has more steps than a
    choice or a refit needs)."""
    return np.unique(np.linspace(0, n - 1, min(n, CHOICE_STEPS)).astype(np.int64))


def _slice_price_margin(model: StepCostModel) -> float:
    if model.design is None:
        return 0.0
    x, y, full = model.design
    chunk = bool(full[1])  # the columns: fixed first, then chunks when some step has them
    rng = np.random.default_rng(0)
    whole, _ = huber_fit(x, y)
    prices = []
    for _ in range(SLICE_BOOTSTRAP):
        pick = rng.integers(0, len(y), len(y))
        # from the whole fit, settled to 0.1 % (a percentile of 40 needs no more)
        coef, _ = huber_fit(x[pick], y[pick], start=whole, rtol=1e-3)
        prices.append(max(coef[0] + (coef[1] if chunk else 0.0), 0.0))
    point = model.fixed_s + model.per_prefill_chunk_s
    return max(float(np.quantile(prices, SLICE_PRICE_QUANTILE)) - point, 0.0)


def _choose(model, timeline, x, y, keep, hardware, fit) -> StepCostModel:
    """The additive model with the roofline fitted beside it, both held-out errors, and
    the one that predicts held-back steps better chosen (module docstring); on the steps
    `fit` selects."""
    prefill = timeline.prefill_tokens > 0
    sizes = timeline.prefill_tokens[prefill & fit] / np.maximum(
        timeline.prefill_seqs[prefill & fit], 1
    )
    typical = float(np.median(sizes)) if len(sizes) else float("nan")
    # The choice and the roofline rest on at most CHOICE_STEPS steps, evenly spread (the
    # alternating fit is many least squares; a long run has more steps than it needs).
    rows = np.flatnonzero(fit)
    pick = rows[_evenly(len(rows))]
    x, y, prefill = x[pick], y[pick], prefill[pick]
    batch = tuple(b[pick] for b in (timeline.prefill_tokens, timeline.decode_seqs,
                                    timeline.context_tokens, timeline.prefill_seqs))  # fmt: skip
    roof = fit_roofline(y, *batch, hardware=hardware)
    add_err = _heldout(y, prefill, lambda tr, te: x[te][:, keep] @ huber_fit(
        x[tr][:, keep], y[tr])[0])  # fmt: skip
    if roof is None:
        return replace(model, additive_heldout_error=add_err, typical_slice_tokens=typical)
    under = roof.roofs_s(*batch)
    memory_bound = under[1] >= under[2]

    def roof_predict(tr, te):
        got = fit_roofline(y[tr], *(b[tr] for b in batch), hardware=hardware,
                           starts=[memory_bound[tr]])  # fmt: skip
        return got.predict_s(*(b[te] for b in batch)) if got is not None else None

    roof_err = _heldout(y, prefill, roof_predict)
    chosen = "roofline" if roof_err < ROOFLINE_MARGIN * add_err else "additive"
    work = batch[0].sum()
    without = roof.predict_s(0.0, batch[1], batch[2], 0.0)
    token_s = float((roof.predict_s(*batch) - without)[prefill].sum() / work) if work else 0.0
    return replace(
        model,
        chosen=chosen,
        roofline_kind=roof.kind,
        additive_heldout_error=add_err,
        roofline_heldout_error=roof_err,
        roofline_token_s=token_s,
        typical_slice_tokens=typical,
        roofline=roof,
    )


def _heldout(y, prefill, predict) -> float:
    """Every HOLDOUT_FOLDS-th step held back in turn and predicted by a fit on the rest;
    the mean over step kinds (with prefill, without; each with 3+ steps) of the median
    |measured − predicted| / predicted. Inf when a fold cannot be fitted."""
    fold = np.arange(len(y)) % HOLDOUT_FOLDS
    pred = np.full(len(y), np.nan)
    for k in range(HOLDOUT_FOLDS):
        te = fold == k
        got = predict(~te, te) if te.any() else None
        if got is None:
            return float("inf")
        pred[te] = got
    rel = np.abs(y - pred) / np.maximum(np.abs(pred), 1e-12)
    kinds = [rel[m] for m in (prefill, ~prefill) if m.sum() >= 3]
    return float(np.mean([np.median(r) for r in kinds])) if kinds else float("nan")


def huber_loss(resid: np.ndarray, scale: float) -> float:
    """Σ Huber's ρ(resid / scale)."""
    u = np.abs(resid) / scale
    return float(np.where(u <= HUBER_K, 0.5 * u**2, HUBER_K * u - 0.5 * HUBER_K**2).sum())


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if np.isfinite(x) else "n/a"


def _robust_bic(resid: np.ndarray, scale: float, terms: int) -> float:
    """Schwarz's criterion on Huber's loss: which terms the steps can tell apart (more
    terms always fit a little better; each must pay log n to stay). Every step counts,
    the few prefill steps among many decodes too, and none counts more than linearly."""
    return 2.0 * huber_loss(resid, scale) + terms * math.log(len(resid))


def huber_fit(
    x: np.ndarray, y: np.ndarray, iters: int = 50, start=None, rtol: float = 1e-7
) -> tuple[np.ndarray, np.ndarray]:
    """Huber M-estimate of y ≈ x·coef by IRLS; returns (coef, final weights). `start`:
    the first coefficients (else least squares); `rtol`: when the iteration has settled."""
    coef = _lstsq(x, y, np.ones(len(y))) if start is None else np.asarray(start, np.float64)
    w = np.ones(len(y))
    for _ in range(iters):
        r = y - x @ coef
        scale = _mad(r)
        if scale <= 0:
            break
        u = np.abs(r) / (HUBER_K * scale)
        w = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
        new = _lstsq(x, y, w)
        done = np.allclose(new, coef, rtol=rtol, atol=1e-12)
        coef = new
        if done:
            break
    return coef, w


def _model(timeline, x, y, coef, keep, weight, compiled) -> StepCostModel:
    fixed = np.full(len(y), coef[0])
    chunk = coef[1] * x[:, 1]
    prefill = chunk + coef[2] * x[:, 2]
    decode = coef[3] * x[:, 3] + coef[4] * x[:, 4]
    predicted = fixed + prefill + decode
    resid = y - predicted
    sigma = _mad(resid[~compiled])
    inflated = (resid > INFLATED_SIGMAS * sigma) & (resid > INFLATED_SHARE * predicted)
    inflated |= compiled & (resid > 0)  # a compile is its own cause, never the batch's
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
            "jit_compile": compiled,
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
        jit_compile_steps=int(compiled.sum()),
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
