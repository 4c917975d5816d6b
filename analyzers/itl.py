"""Every gap between two deliveries of a request, explained by the steps it spanned
(definitions in docs/metrics.md).

A delivery carries the tokens sampled in one or more engine steps; its last token was
sampled at P (the start of sampling in that step, or the token event when sampling is
not separately timed). The gap [previous delivery, this delivery] is cut at P:
- before P, along the step timeline split by the run's step cost model (step_cost.py):
  in the request's own steps, the fixed cost and the batch's decodes (`decode`: what a
  decode step costs), the prefill chunks batched with it at their marginal cost
  (`interference`), and the residual of an inflated step (`inflation`: a step slower
  than its batch explains — never charged to prefill); steps the request sat out are
  others' work (`interference`, their residual `inflation`), or `preemption` when the
  request was preempted in the gap; time between steps is `host_gap` (scheduler, output
  processing, the host loop), except where a probe held the engine (`probe`);
- after P: `stream_out`, sampling and the way to the client (output routing, stream
  buffering, the client's event loop), again less any probe stall.
What the run cannot explain (no engine events for the tokens, no steps) is `remainder`;
parts + remainder = gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .lifecycle import Lifecycle
from .steady_state import INTERNAL
from .steptime import NO_STALLS, Stalls, StepParts, StepTimeline

NS = 1e9
CAUSES = ("decode", "interference", "inflation", "preemption", "probe", "host_gap",
          "stream_out", "remainder")  # fmt: skip
_COLS = tuple(f"{c}_s" for c in CAUSES)


@dataclass(frozen=True)
class ItlParts:
    """Mean seconds per gap of each cause, over a set of gaps (they add up to gap_s)."""

    gaps: int
    gap_s: float
    decode_s: float
    interference_s: float
    inflation_s: float
    preemption_s: float
    probe_s: float
    host_gap_s: float
    stream_out_s: float
    remainder_s: float


@dataclass(frozen=True)
class DominantCauses:
    """How many gaps each cause dominated (the largest part)."""

    decode: int
    interference: int
    inflation: int
    preemption: int
    probe: int
    host_gap: int
    stream_out: int
    remainder: int


@dataclass(frozen=True)
class ItlAttribution:
    mean: ItlParts  # every gap
    tail: ItlParts  # gaps at or above the p99 gap: what makes the spikes
    dominant: DominantCauses
    dominant_in_tail: DominantCauses
    remainder_share: float  # Σ|remainder| / Σ gaps
    per_gap: pd.DataFrame = field(metadata=INTERNAL)


def attribute_itl(
    lc: Lifecycle,
    gaps: pd.DataFrame,
    steps: StepTimeline | None,
    select: np.ndarray,
    parts_of_steps: StepParts | None = None,
    stalls: Stalls = NO_STALLS,
) -> ItlAttribution:
    """Attribute the gaps (from metrics.delivery_gaps) of the selected requests;
    `parts_of_steps` splits the steps (token counts when None), `stalls` are intervals
    in which a probe held the engine."""
    if steps is not None and parts_of_steps is None:
        parts_of_steps = StepParts.from_model(steps, None)
    g = gaps[select[gaps["code"].to_numpy()]] if len(gaps) else gaps
    n = len(g)
    t_prev, t = g["t_prev"].to_numpy(), g["t"].to_numpy()
    parts = {c: np.zeros(n) for c in _COLS}
    p = np.full(n, np.nan)
    if n and lc.has_engine:
        own_pos, own_gap = _own_tokens(lc, g)
        if len(own_pos):
            p = _sampling_points(lc, own_pos, own_gap, n, steps)
        if steps is not None and len(own_pos):
            _split_steps(parts, lc, g, steps, parts_of_steps, own_pos, own_gap, p)
        known = ~np.isnan(p)
        cut = np.where(known, np.clip(p, t_prev, t), t_prev)
        out = np.where(known, t - cut, 0.0)
        held_out = np.minimum(stalls.between(cut, t), out)
        parts["stream_out_s"] = out - held_out
        parts["probe_s"] = np.where(known, held_out, 0.0)
        if steps is not None:
            busy = steps.busy_between(t_prev, cut)
            host = np.where(known, (cut - t_prev) - busy, 0.0)
            held = np.minimum(stalls.between(t_prev, cut), np.maximum(host, 0.0))
            parts["host_gap_s"] = host - held
            parts["probe_s"] = parts["probe_s"] + held
    gap = t - t_prev
    explained = sum(parts[c] for c in _COLS if c != "remainder_s")
    parts["remainder_s"] = gap - explained
    frame = pd.DataFrame({"code": g["code"].to_numpy(), "chunk": g["chunk"].to_numpy(),
                          "tokens": g["tokens"].to_numpy(), "gap_s": gap / NS})  # fmt: skip
    for c in _COLS:
        frame[c] = parts[c] / NS
    biggest = np.argmax(frame[list(_COLS)].to_numpy(), axis=1)
    frame["dominant"] = pd.Categorical.from_codes(biggest, categories=CAUSES)
    ids = pd.Index(lc.requests["request_id"].to_numpy(dtype=object))
    frame.insert(0, "request_id", pd.Categorical.from_codes(frame["code"], categories=ids))
    gap_s = frame["gap_s"].to_numpy()
    # The tail is chosen on the engine's share of each gap: a gap stretched by a probe
    # stall is the probe's (the gate reports it), not an engine spike.
    net = gap_s - frame["probe_s"].to_numpy()
    tail = net >= np.percentile(net, 99) if n else np.zeros(0, dtype=bool)
    return ItlAttribution(
        mean=_parts(frame, np.ones(n, dtype=bool)),
        tail=_parts(frame, tail),
        dominant=_dominant(frame["dominant"]),
        dominant_in_tail=_dominant(frame["dominant"][tail]),
        remainder_share=float(np.abs(frame["remainder_s"]).sum() / gap_s.sum())
        if n and gap_s.sum() > 0
        else float("nan"),
        per_gap=frame,
    )


def _own_tokens(lc: Lifecycle, g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Engine token events (rows of lc.engine) and the gap (row of g) whose delivery
    carried each: token n of a request is in the first delivery whose running token
    count reaches n."""
    d = lc.deliveries
    code = d["code"].to_numpy().astype(np.int64)
    cum = d.groupby("code", sort=False)["tokens"].cumsum().to_numpy().astype(np.int64)
    e = lc.engine
    tok = np.flatnonzero(e["kind"].isin(["first_token", "token"]).to_numpy())
    n_out = e["num_tokens"].to_numpy()[tok]
    tok = tok[~np.isnan(n_out)]
    n_out = n_out[~np.isnan(n_out)].astype(np.int64)
    scale = int(max(cum.max(initial=0), n_out.max(initial=0))) + 1
    keys = code * scale + cum  # sorted: deliveries are in (code, time) order
    tcode = e["code"].to_numpy()[tok].astype(np.int64)
    at = np.searchsorted(keys, tcode * scale + n_out, side="left")
    found = at < len(keys)
    found[found] = code[at[found]] == tcode[found]
    local = np.full(len(d), -1, dtype=np.int64)  # delivery → row of g, if selected
    local[g["delivery"].to_numpy()] = np.arange(len(g))
    gap_local = np.where(found, local[np.minimum(at, len(keys) - 1)], -1)
    keep = gap_local >= 0
    return tok[keep], gap_local[keep]


def _sampling_points(lc, own_pos, own_gap, n, steps) -> np.ndarray:
    """P per gap: when the last token of the delivery began sampling."""
    e = lc.engine
    t_tok = e["t"].to_numpy()[own_pos]
    if steps is not None:
        pos = steps.index_of(e["step"].to_numpy()[own_pos])
        ss = np.where(pos >= 0, steps.sample_start[np.maximum(pos, 0)], np.nan)
        t_tok = np.where(np.isnan(ss), t_tok, ss)
    p = np.full(n, -np.inf)
    np.maximum.at(p, own_gap, t_tok)
    return np.where(np.isinf(p), np.nan, p)


def _split_steps(parts, lc, g, steps: StepTimeline, sp: StepParts, own_pos, own_gap, p) -> None:
    e = lc.engine
    t_prev = g["t_prev"].to_numpy()
    cut = np.where(np.isnan(p), t_prev, np.maximum(p, t_prev))
    pos = steps.index_of(e["step"].to_numpy()[own_pos])
    ok = pos >= 0
    pos, gi = pos[ok], own_gap[ok]
    # A step counts once per gap, however many of the delivery's tokens it made (a
    # speculative step emits several, delivered together).
    pair = np.unique(np.stack([gi, pos]), axis=1)
    gi, pos = pair[0], pair[1]
    lo = np.maximum(steps.start[pos], t_prev[gi])
    hi = np.minimum(steps.end[pos], cut[gi])
    dur = steps.end[pos] - steps.start[pos]
    frac = np.divide(np.maximum(hi - lo, 0.0), dur, out=np.zeros(len(pos)), where=dur > 0)
    of = sp.of(pos)
    n = len(g)

    def own(*names: str) -> np.ndarray:
        return np.bincount(gi, frac * sum(of[k] for k in names), minlength=n)

    inside = sp.between(t_prev, cut)
    decode = own("fixed", "decode")
    interference = own("prefill")
    # Steps the request sat out inside the gap are others' work; every step's residual in
    # the gap, its own or sat out, is inflation.
    others = np.maximum(inside["fixed"] + inside["prefill"] + inside["decode"] - decode
                        - interference, 0.0)  # fmt: skip
    inflation = inside["residual"]
    preempted = _preempted_in_gap(lc, g)
    parts["decode_s"] = np.where(preempted, 0.0, decode)
    parts["interference_s"] = np.where(preempted, 0.0, interference + others)
    parts["inflation_s"] = inflation
    parts["preemption_s"] = np.where(preempted, decode + interference + others, 0.0)


def _preempted_in_gap(lc: Lifecycle, g: pd.DataFrame) -> np.ndarray:
    e = lc.engine
    pre = e[(e["kind"] == "preempted").to_numpy()]
    out = np.zeros(len(g), dtype=bool)
    if len(pre) == 0 or len(g) == 0:
        return out
    right = pd.DataFrame({"code": g["code"].to_numpy(), "t_gap": g["t"].to_numpy(),
                          "t_prev": g["t_prev"].to_numpy(), "row": np.arange(len(g))})  # fmt: skip
    joined = pd.merge_asof(
        pre[["code", "t"]].sort_values("t"),
        right.sort_values("t_gap"),
        left_on="t",
        right_on="t_gap",
        by="code",
        direction="forward",
    ).dropna(subset=["row"])
    inside = joined["t"].to_numpy() > joined["t_prev"].to_numpy()
    out[joined["row"].to_numpy()[inside].astype(np.int64)] = True
    return out


def _parts(frame: pd.DataFrame, mask: np.ndarray) -> ItlParts:
    sub = frame[mask]
    if len(sub) == 0:
        return ItlParts(0, *([float("nan")] * (len(_COLS) + 1)))
    m = sub[["gap_s", *_COLS]].mean()
    return ItlParts(len(sub), *(float(m[c]) for c in ("gap_s", *_COLS)))


def _dominant(col: pd.Series) -> DominantCauses:
    counts = col.value_counts()
    return DominantCauses(*(int(counts.get(c, 0)) for c in CAUSES))
