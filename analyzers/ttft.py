"""TTFT decomposed along the request's critical path (definitions in docs/metrics.md).

A request's first token is gated by a chain of milestones, each after the last:
sent → tokenised (input processing: hand-off, tokenisation, validation) → start of the
step that admits it (engine queue: the engine's inbox while a step runs, then its
waiting queue) → sampling of its first token in step K (prefill) → the client receives
it (sampling and return). The milestones cut [sent, first token]
into consecutive pieces, so the parts never overlap and add up to the TTFT.

The prefill piece is split along the step timeline by the run's step cost model
(step_cost.py): in the steps where the request's chunks ran, its own tokens at their
marginal cost (`prefill_own`), the fixed cost every step pays (`step_overhead`: many small
chunks pay it many times) and the rest of the batch (`prefill_others`); steps it sat out
are others' work; the residual of inflated steps is `inflation` (never charged to
prefill); gaps between steps are host/scheduler time; a swap-in from the CPU tier is the
unhidden cache load; waits after a preemption count as queue again. Time in which a
probe held the engine (a profiler starting or stopping) is `probe`, carved out of
whichever part it fell in. Whatever no milestone explains (events or steps the run
lacks) is the explicit remainder: parts + remainder = TTFT, always.

The client's wait for a slot under a concurrency cap happens before the request is sent,
outside TTFT as every tool defines it: it is reported beside the parts, not in them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .lifecycle import Lifecycle
from .steady_state import INTERNAL
from .steptime import NO_STALLS, Stalls, StepParts, StepTimeline

NS = 1e9
PARTS = ("input_s", "queue_s", "cache_load_s", "prefill_own_s", "step_overhead_s",
         "prefill_others_s", "inflation_s", "probe_s", "host_gap_s", "sample_return_s",
         "remainder_s")  # fmt: skip


def prefill_steps_s(per_request: pd.DataFrame) -> np.ndarray:
    """Per request, the modelled time of the steps in its prefill window: its own tokens,
    the step overhead and others' work (inflation left out)."""
    cols = ("prefill_own_s", "step_overhead_s", "prefill_others_s")
    return sum(per_request[c].to_numpy("float64") for c in cols)


@dataclass(frozen=True)
class TtftParts:
    """Mean TTFT and mean parts over a set of requests (they add up to the TTFT)."""

    requests: int
    ttft_s: float
    client_wait_s: float  # before the send: not part of TTFT
    input_s: float
    queue_s: float
    cache_load_s: float
    prefill_own_s: float
    step_overhead_s: float
    prefill_others_s: float
    inflation_s: float
    probe_s: float
    host_gap_s: float
    sample_return_s: float
    remainder_s: float


@dataclass(frozen=True)
class TtftDecomposition:
    mean: TtftParts  # every decomposed request
    p50: TtftParts  # requests whose TTFT lies between its p45 and p55
    p99: TtftParts  # requests at or above the p99 TTFT less probe stalls: the engine's tail
    remainder_share: float  # Σ|remainder| / Σ TTFT
    max_sum_error: float  # max |parts + remainder − TTFT| / TTFT over requests
    engine_events: bool  # False: no engine lifecycle, everything is remainder
    step_timeline: bool  # False: no steps, the prefill split is remainder
    per_request: pd.DataFrame = field(metadata=INTERNAL)


def decompose_ttft(
    lc: Lifecycle,
    steps: StepTimeline | None,
    select: np.ndarray,
    parts_of_steps: StepParts | None = None,
    stalls: Stalls = NO_STALLS,
) -> TtftDecomposition:
    """Decompose the TTFT of the selected requests (boolean mask over lc.requests).
    `parts_of_steps`: the steps split by the cost model (token counts when None);
    `stalls`: intervals in which a probe held the engine."""
    if steps is not None and parts_of_steps is None:
        parts_of_steps = StepParts.from_model(steps, None)
    r = lc.requests
    t0, t1 = r["t_sent"].to_numpy(), r["t_first"].to_numpy()
    sel = select & ~np.isnan(t0) & ~np.isnan(t1) & (t1 >= t0)
    idx = np.flatnonzero(sel)
    rr = r.iloc[idx]
    t0, t1 = t0[idx], t1[idx]
    known = ~np.isnan(rr["step_first_sched"].to_numpy()) & ~np.isnan(
        rr["step_engine_first"].to_numpy()
    )
    q = _first_known(rr, ("t_tokenize_end", "t_queued", "t_arrival"))
    q = np.where(np.isnan(q), t0, np.clip(q, t0, t1))
    s0 = rr["t_first_sched"].to_numpy()
    p = rr["t_engine_first"].to_numpy()
    if steps is not None:
        pos0 = steps.index_of(rr["step_first_sched"].to_numpy())
        s0 = np.where(pos0 >= 0, steps.start[pos0], s0)
        posk = steps.index_of(rr["step_engine_first"].to_numpy())
        p = np.where((posk >= 0) & ~np.isnan(steps.sample_start[posk]), steps.sample_start[posk], p)
    s0 = np.where(known, np.clip(s0, q, t1), q)
    p = np.where(known, np.clip(p, s0, t1), s0)
    n = len(idx)
    parts = {name: np.zeros(n) for name in PARTS}
    parts["input_s"] = np.where(known, q - t0, 0.0)
    parts["queue_s"] = np.where(known, s0 - q, 0.0)
    parts["sample_return_s"] = np.where(known, t1 - p, 0.0)
    if steps is not None:
        _split_prefill(parts, lc, steps, parts_of_steps, idx, s0, p, stalls)
    windows = {"input_s": (t0, q), "queue_s": (q, s0), "sample_return_s": (p, t1)}
    for name, (a, b) in windows.items():
        held = np.where(known, np.minimum(stalls.between(a, b), parts[name]), 0.0)
        parts[name] = parts[name] - held
        parts["probe_s"] = parts["probe_s"] + held
    explained = sum(parts[k] for k in PARTS if k != "remainder_s")
    parts["remainder_s"] = (t1 - t0) - explained
    frame = pd.DataFrame({"request_id": rr["request_id"].to_numpy(), "ttft_s": (t1 - t0) / NS})
    frame["client_wait_s"] = (t0 - rr["t_created"].to_numpy()) / NS
    for k in PARTS:
        frame[k] = parts[k] / NS
    # Of step_overhead_s, the chunks beyond each prompt's first (chunk-too-small reads it).
    frame["extra_chunks_s"] = parts.get("extra_chunks_s", np.zeros(n)) / NS
    frame["prefill_steps"] = parts.get("prefill_steps", np.zeros(n))
    frame["prefill_tokens"] = parts.get("prefill_tokens", np.zeros(n))
    total = frame[list(PARTS)].sum(axis=1).to_numpy()
    ttft = frame["ttft_s"].to_numpy()
    err = np.abs(total - ttft) / np.where(ttft > 0, ttft, 1.0)
    return TtftDecomposition(
        mean=_parts(frame, np.ones(n, dtype=bool)),
        p50=_parts(frame, _band(ttft, 45, 55)),
        p99=_parts(frame, _band(ttft - frame["probe_s"].to_numpy(), 99, 100)),  # as in itl.py
        remainder_share=float(np.abs(frame["remainder_s"]).sum() / ttft.sum()) if n else np.nan,
        max_sum_error=float(err.max()) if n else np.nan,
        engine_events=bool(known.any()),
        step_timeline=steps is not None,
        per_request=frame,
    )


def _split_prefill(parts, lc: Lifecycle, steps: StepTimeline, sp: StepParts, idx, s0, p,
                   stalls: Stalls) -> None:  # fmt: skip
    """Attribute [s0, p] of each request to own compute, step overhead, others' work,
    inflation, host gaps, probe stalls, cache load and re-queueing after preemption (in
    place)."""
    n = len(idx)
    local = np.full(len(lc.requests), -1, dtype=np.int64)
    local[idx] = np.arange(n)
    inside = sp.between(s0, p)
    step_time = sum(inside.values())
    first_step = lc.requests["step_engine_first"].to_numpy()

    e = lc.engine
    code = e["code"].to_numpy()
    li = local[code]
    step = e["step"].to_numpy()
    mine = (li >= 0) & ~np.isnan(step)
    mine &= step <= np.nan_to_num(first_step[code], nan=-1.0)  # at or before the first token

    def kind(name: str) -> np.ndarray:
        return (e["kind"] == name).to_numpy()

    # A swap-in copies the request's KV back during the schedule phase of the step that
    # resumes it: from the step's start to the `resumed` event, nothing else can proceed.
    cache = np.zeros(n)
    swap_key, swap_end = np.zeros(0, dtype=np.int64), np.zeros(0)
    swap = mine & kind("resumed") & (e["detail"] == "swap").to_numpy()
    if swap.any():
        s_li, s_pos = li[swap], steps.index_of(step[swap])
        ok = s_pos >= 0
        s_li, s_pos, s_t = s_li[ok], s_pos[ok], e["t"].to_numpy()[swap][ok]
        cache = np.bincount(s_li, np.maximum(s_t - steps.start[s_pos], 0.0), minlength=n)
        order = np.argsort(s_li * len(steps) + s_pos)
        swap_key, swap_end = (s_li * len(steps) + s_pos)[order], s_t[order]

    chunk = mine & kind("prefill_chunk")
    c_li = li[chunk]
    pos = steps.index_of(step[chunk])
    ok = pos >= 0
    c_li, pos = c_li[ok], pos[ok]
    tokens = e["num_tokens"].to_numpy()[chunk][ok]
    lo = np.maximum(steps.start[pos], s0[c_li])
    if len(swap_key):  # in a swap-in step the chunk computes only after the copy
        key = c_li * len(steps) + pos
        at = np.minimum(np.searchsorted(swap_key, key), len(swap_key) - 1)
        lo = np.where(swap_key[at] == key, np.maximum(lo, swap_end[at]), lo)
    hi = np.minimum(steps.end[pos], p[c_li])
    dur = steps.end[pos] - steps.start[pos]
    frac = np.divide(np.maximum(hi - lo, 0.0), dur, out=np.zeros(len(pos)), where=dur > 0)
    of = sp.of(pos)
    in_step = steps.prefill_tokens[pos]
    mine_share = np.divide(tokens, in_step, out=np.ones(len(pos)), where=in_step > 0)
    # A prompt needs one chunk: its first chunk's own cost (beyond its tokens) is its
    # prefill; every further chunk's is the price of slicing, overhead like the step's
    # fixed cost. The rest of the step's prefill is shared by tokens.
    seqs = np.maximum(steps.prefill_seqs[pos], 1.0)
    chunk_cost = frac * sp.chunk[pos] / seqs
    tokens_part = np.maximum(of["prefill"] - sp.chunk[pos], 0.0)
    order = np.lexsort((steps.start[pos], c_li))
    first = np.zeros(len(pos), dtype=bool)
    first[order[np.r_[True, c_li[order][1:] != c_li[order][:-1]]] if len(pos) else []] = True
    own_part = frac * tokens_part * np.clip(mine_share, 0, 1) + np.where(first, chunk_cost, 0.0)
    own = np.bincount(c_li, own_part, minlength=n)
    extra_chunks = np.bincount(c_li, np.where(first, 0.0, chunk_cost), minlength=n)
    overhead = np.bincount(c_li, frac * of["fixed"], minlength=n) + extra_chunks

    others = np.maximum(inside["fixed"] + inside["prefill"] + inside["decode"] - own - overhead, 0)
    inflation = inside["residual"]
    requeue_steps, requeue_host = _requeue(lc, steps, local, mine & kind("preempted"), n)
    # The swap-in copy and the steps run while preempted came out of the steps' time:
    # take them from others' work and inflation in proportion.
    pool = others + inflation
    taken = np.minimum(cache + requeue_steps, pool)
    keep = np.divide(pool - taken, pool, out=np.zeros(n), where=pool > 0)
    host = np.maximum((p - s0) - step_time, 0.0)
    held = np.minimum(stalls.between(s0, p), host)
    parts["queue_s"] = parts["queue_s"] + requeue_steps + requeue_host
    parts["cache_load_s"] = cache
    parts["prefill_own_s"] = own
    parts["step_overhead_s"] = overhead
    parts["extra_chunks_s"] = extra_chunks  # of step_overhead_s: chunks beyond the first
    # Counts, not times: the steps the prompt's chunks ran in and the tokens they computed
    # (what a different chunk size would change; ttft-prefill-interference prices it).
    parts["prefill_steps"] = np.bincount(c_li, minlength=n).astype(np.float64)
    parts["prefill_tokens"] = np.bincount(
        c_li, np.nan_to_num(tokens.astype(np.float64)), minlength=n
    )
    parts["prefill_others_s"] = others * keep
    parts["inflation_s"] = inflation * keep
    parts["probe_s"] = held
    parts["host_gap_s"] = np.maximum(host - held - requeue_host, 0.0)


def _requeue(lc: Lifecycle, steps: StepTimeline, local, preempted, n):
    """Step time and host time a request spent preempted before its first token: from
    the preemption to the start of the step that took it back."""
    zero = (np.zeros(n), np.zeros(n))
    if not preempted.any():
        return zero
    e = lc.engine
    back = e[e["kind"].isin(["scheduled", "resumed"]).to_numpy() & ~np.isnan(e["step"].to_numpy())]
    left = e[preempted][["code", "t"]].sort_values("t")
    right = back[["code", "t", "step"]].sort_values("t").rename(columns={"t": "t_back"})
    joined = pd.merge_asof(
        left, right, left_on="t", right_on="t_back", by="code", direction="forward"
    )
    pos = steps.index_of(joined["step"].to_numpy())
    ok = pos >= 0
    a = joined["t"].to_numpy()[ok]
    b = np.maximum(steps.start[pos[ok]], a)
    in_steps = steps.busy_between(a, b)
    li = local[joined["code"].to_numpy()[ok]]
    return (
        np.bincount(li, in_steps, minlength=n),
        np.bincount(li, (b - a) - in_steps, minlength=n),
    )


def _first_known(frame: pd.DataFrame, columns) -> np.ndarray:
    out = frame[columns[0]].to_numpy().copy()
    for col in columns[1:]:
        out = np.where(np.isnan(out), frame[col].to_numpy(), out)
    return out


def _band(values: np.ndarray, lo_q: float, hi_q: float) -> np.ndarray:
    if len(values) == 0:
        return np.zeros(0, dtype=bool)
    lo, hi = np.percentile(values, [lo_q, hi_q])
    band = (values >= lo) & (values <= hi)
    if not band.any():
        mid = np.percentile(values, (lo_q + hi_q) / 2)
        band[np.argmin(np.abs(values - mid))] = True
    return band


def _parts(frame: pd.DataFrame, mask: np.ndarray) -> TtftParts:
    sub = frame[mask]
    means = sub[["ttft_s", "client_wait_s", *PARTS]].mean() if len(sub) else None

    def m(col: str) -> float:
        return float(means[col]) if means is not None else float("nan")

    return TtftParts(int(mask.sum()), *(m(c) for c in ("ttft_s", "client_wait_s", *PARTS)))
