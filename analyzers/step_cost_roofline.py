"""The hardware-shaped ("roofline") step model, beside the additive one (step_cost.py).

A GPU step costs about

    dur ≈ overhead + max(memory, compute)
    memory  = (weight bytes + K/V bytes read) / bandwidth     (weights once per step)
    compute = FLOPs / peak,  FLOPs ≈ 2·params·tokens + 4·H·d·L·(query, key) pairs

so below the ridge one more token is nearly free (the weights are read once whatever the
batch holds) and above it every token costs its FLOPs. An additive fit draws one line
through both regimes and prices a slice of a prompt many times too high on a GPU.

Two forms, both fitted robustly (Huber, as the additive fit) with the roof each step
sits under found by alternation (assign each step to the larger roof, refit, repeat;
several starting ridges, the lowest Huber loss kept):
- `physics`: the run records its model and the device's ceilings (hardware/ceilings.py
  `resolve`, measured by `perfdiag calibrate`). FLOPs and bytes per step come from
  model_flops; the fit keeps four numbers: overhead, a cost per prompt chunk, and the
  inverse efficiency of each roof: dur ≈ o + s·chunks + max(bytes/bw / e_m, FLOPs/peak / e_c).
- `hinge`: otherwise the max of two affine functions of the batch, from the steps alone:
  dur ≈ o + s·chunks + max(w + k·context + m·tokens, c·tokens), where tokens = prefill
  tokens + decoding sequences. Attention's quadratic term is left out here: the steps
  do not record a chunk's cached context, and without it a fitted price per (query, key)
  pair makes slicing look cheaper than it is (a later slice attends to the earlier ones).
Physics counts a chunk's pairs with `cached_tokens` of context before it (0 unless the
caller knows: slice_price_s gives the second slice the first one's tokens).
Every price is >= 0 (a column whose price comes out negative is dropped and the fit
repeated), as in the additive fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model_flops import ModelShape, StepShape, step_totals

MIN_PER_ROOF = 4  # steps under a roof for its prices to mean anything
ALTERNATIONS = 25
STARTS = 8  # starting ridges: quantiles of the steps' tokens


@dataclass(frozen=True)
class Hardware:
    """What the physics form needs: the model's shape and the device's ceilings."""

    model: ModelShape
    peak_flops_per_s: float
    bytes_per_s: float
    device: str
    ceilings_kind: str  # measured | datasheet


@dataclass(frozen=True)
class RooflineFit:
    kind: str  # physics | hinge
    shared: np.ndarray  # prices of the columns every step pays (overhead, per chunk)
    memory: np.ndarray  # prices of the memory roof's columns
    compute: np.ndarray  # prices of the compute roof's columns
    memory_bound_share: float  # of the fitted steps
    hardware: Hardware | None = None

    def roofs_s(self, prefill_tokens=0.0, decode_seqs=0.0, context_tokens=0.0, chunks=0.0,
                cached_tokens=0.0):  # fmt: skip
        """(shared part, memory roof, compute roof) of a batch, in seconds (arrays broadcast)."""
        s, m, c = features(self.kind, self.hardware, prefill_tokens, decode_seqs,
                           context_tokens, chunks, cached_tokens)  # fmt: skip
        return s @ self.shared, m @ self.memory, c @ self.compute

    def predict_s(self, prefill_tokens=0.0, decode_seqs=0.0, context_tokens=0.0, chunks=0.0,
                  cached_tokens=0.0):  # fmt: skip
        s, m, c = self.roofs_s(prefill_tokens, decode_seqs, context_tokens, chunks,
                               cached_tokens)  # fmt: skip
        return s + np.maximum(m, c)


def features(kind, hardware, prefill_tokens, decode_seqs, context_tokens, chunks,
             cached_tokens=0.0):  # fmt: skip
    """Columns (shared, memory roof, compute roof) per step, as 2-D arrays. `cached_tokens`:
    context before each chunk (physics only)."""
    n, b, k, p, cached = np.broadcast_arrays(*(
        np.atleast_1d(np.asarray(v, np.float64))
        for v in (prefill_tokens, decode_seqs, context_tokens, chunks, cached_tokens)))  # fmt: skip
    # A step with prefill tokens has at least one chunk, whatever the caller said.
    p = np.where((n > 0) & (p <= 0), 1.0, p)
    per_chunk = np.divide(n, p, out=np.zeros_like(n), where=p > 0)
    shared = np.column_stack((np.ones_like(n), p))
    if kind == "hinge":
        tokens = n + b
        return shared, np.column_stack((np.ones_like(n), k, tokens)), tokens[:, None]
    m = hardware.model
    pairs = p * per_chunk * (cached + (per_chunk + 1) / 2)  # causal (query, key) pairs
    decode_kv = np.maximum(k - n - p * cached, b)  # context after the step, less the prompts'
    shape = StepShape(n, pairs, p * per_chunk * (cached + per_chunk), n + p * cached, b,
                      decode_kv, b + p)  # fmt: skip
    flops, nbytes = step_totals(m, shape)
    mem = np.asarray(nbytes, np.float64) / hardware.bytes_per_s
    comp = np.asarray(flops, np.float64) / hardware.peak_flops_per_s
    return shared, mem[:, None], comp[:, None]


def fit_roofline(y, prefill_tokens, decode_seqs, context_tokens, chunks,
                 hardware: Hardware | None = None, starts=None) -> RooflineFit | None:  # fmt: skip
    """The roofline fit of step times `y` (seconds), or None when the steps cannot tell
    two roofs apart (every step under one, or fewer than MIN_PER_ROOF under either)."""
    kind = "physics" if hardware is not None else "hinge"
    shared, mem, comp = features(kind, hardware, prefill_tokens, decode_seqs, context_tokens,
                                 chunks)  # fmt: skip
    tokens = np.asarray(prefill_tokens, np.float64) + np.asarray(decode_seqs, np.float64)
    if starts is None:
        qs = np.unique(np.quantile(tokens, np.linspace(0.1, 0.9, STARTS)))
        starts = [tokens <= q for q in qs]
    scale = max(0.05 * float(np.median(y)), 1e-9)  # one scale, so the starts' losses compare
    best = None
    for under_memory in starts:
        got = _alternate(y, shared, mem, comp, under_memory, scale)
        if got is not None and (best is None or got[0] < best[0]):
            best = got
    if best is None:
        return None
    _, coef, under_memory = best
    ns, nm = shared.shape[1], mem.shape[1]
    return RooflineFit(
        kind,
        coef[:ns],
        coef[ns : ns + nm],
        coef[ns + nm :],
        float(under_memory.mean()),
        hardware,
    )


def _alternate(y, shared, mem, comp, under_memory, scale):
    from .step_cost import huber_fit, huber_loss  # step_cost imports this module

    z = np.asarray(under_memory, bool)
    rows = np.maximum(y, 0.05 * float(np.median(y)) + 1e-12)
    coef = None
    for _ in range(ALTERNATIONS):
        if z.sum() < MIN_PER_ROOF or (~z).sum() < MIN_PER_ROOF:
            return None
        x = np.column_stack((shared, mem * z[:, None], comp * (~z)[:, None]))
        # Relative residuals: a step's noise grows with its length, and the small steps
        # are the ones that pin the overhead (the intercept) down.
        coef = _nonnegative_fit(huber_fit, x / rows[:, None], y / rows)
        ns, nm = shared.shape[1], mem.shape[1]
        new = mem @ coef[ns : ns + nm] >= comp @ coef[ns + nm :]
        if (new == z).all():
            break
        z = new
    if z.sum() < MIN_PER_ROOF or (~z).sum() < MIN_PER_ROOF:
        return None
    ns, nm = shared.shape[1], mem.shape[1]
    pred = shared @ coef[:ns] + np.maximum(mem @ coef[ns : ns + nm], comp @ coef[ns + nm :])
    return huber_loss(y - pred, scale), coef, z


def _nonnegative_fit(huber_fit, x, y) -> np.ndarray:
    """Huber fit with every price >= 0: drop the most negative column, refit."""
    keep = np.abs(x).max(axis=0) > 0
    coef = np.zeros(x.shape[1])
    while keep.any():
        got, _ = huber_fit(x[:, keep], y, iters=20)
        coef[:] = 0.0
        coef[keep] = got
        if (got >= 0).all():
            break
        keep[np.flatnonzero(keep)[np.argmin(got)]] = False
    return coef


def hardware_of(run, ceilings_dir=None) -> Hardware | None:
    """The run's model shape and its device's ceilings (measured first: ceilings.resolve),
    or None when the run does not record a model config that describes a model."""
    from ..errors import ConfigError
    from ..hardware.ceilings import resolve
    from .model_flops import for_engine_config
    from .roofline import _run_dtype, find_model_config, run_device, run_gpu

    config = run.manifest.config
    found = find_model_config(config)
    if not found:
        return None
    dtype = _run_dtype(config)
    try:
        model = ModelShape.from_dict(found, dtype=dtype)
    except (ValueError, TypeError, ArithmeticError):  # a config edited or foreign
        return None
    engine = config.get("engine_config") if isinstance(config, dict) else None
    if isinstance(engine, dict):
        model = for_engine_config(model, engine)
    try:
        c = resolve(run_device(run), ceilings_dir, gpu=run_gpu(run))
        peak = c.peak_flops(dtype)
    except ConfigError:  # an unreadable ceilings file: the hinge, from the steps alone
        return None
    return Hardware(model, peak, c.bytes_per_s, c.device, c.kind)
