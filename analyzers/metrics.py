"""Serving metrics (definitions in docs/metrics.md): per request TTFT, TPOT, E2E, every
gap between deliveries, token counts; their distributions; throughput, goodput and
outcome rates over the analysis window. Warm-up requests never count.

Which requests: those sent inside the window (the steady state by default). TTFT and ITL
cover every such request that received tokens (a request cancelled after three tokens
had a real first token); TPOT and E2E only those that ended normally (stop or length).
Rates over the window count what happened in it: tokens delivered, requests completed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .distribution import Dist
from .lifecycle import Lifecycle
from .slo import Slo, judge
from .steady_state import INTERNAL, Window

NS = 1e9


@dataclass(frozen=True)
class Outcomes:
    requests: int  # measured requests sent in the window
    ok: int
    cancelled: int
    timeout: int
    rejected: int
    error: int
    unfinished: int
    warmup_excluded: int


@dataclass(frozen=True)
class Rates:
    error_rate: float
    rejection_rate: float
    cancellation_rate: float
    timeout_rate: float


@dataclass(frozen=True)
class Throughput:
    window_s: float
    output_tokens: int  # delivered inside the window
    input_tokens: int  # prompts of requests whose first token came inside the window
    completed: int  # requests that ended normally inside the window
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float


@dataclass(frozen=True)
class Goodput:
    slo: Slo
    judged: int  # requests sent in the window, client cancellations left out
    good: int
    attainment: float  # good / judged: failures, rejections and timeouts are misses
    requests_per_s: float  # good requests completed inside the window, per second
    output_tokens_per_s: float  # their output tokens, per second
    missed_failed: int  # error, rejected, timeout or unfinished
    missed_ttft: int
    missed_tpot: int
    missed_itl: int
    missed_e2e: int


@dataclass(frozen=True)
class ServingMetrics:
    basis: str  # client: as the load client saw it; engine: engine-side only
    window: Window
    outcomes: Outcomes
    rates: Rates
    throughput: Throughput
    ttft_s: Dist
    tpot_s: Dist
    e2e_s: Dist
    itl_per_chunk_s: Dist
    itl_per_token_s: Dist
    tokens_per_chunk: Dist
    prompt_tokens: Dist
    output_tokens: Dist
    goodput: Goodput | None
    per_request: pd.DataFrame = field(metadata=INTERNAL)
    gaps: pd.DataFrame = field(metadata=INTERNAL)


def delivery_gaps(lc: Lifecycle) -> pd.DataFrame:
    """Every gap between consecutive deliveries of one request: code, delivery (row of
    lc.deliveries ending the gap), chunk (its index in the request, ≥ 1), t_prev, t,
    tokens (carried by the later delivery), gap_s."""
    d = lc.deliveries
    code, t, tokens = d["code"].to_numpy(), d["t"].to_numpy(), d["tokens"].to_numpy()
    same = np.flatnonzero(code[1:] == code[:-1]) + 1
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]]) if len(code) else same
    first_of = np.repeat(starts, np.diff(np.r_[starts, len(code)]))
    return pd.DataFrame(
        {
            "code": code[same],
            "delivery": same,
            "chunk": same - first_of[same],
            "t_prev": t[same - 1],
            "t": t[same],
            "tokens": tokens[same],
            "gap_s": (t[same] - t[same - 1]) / NS,
        }
    )


def per_request(lc: Lifecycle, window: Window, gaps: pd.DataFrame) -> pd.DataFrame:
    r = lc.requests
    n = len(r)
    sent, first, done = r["t_sent"].to_numpy(), r["t_first"].to_numpy(), r["t_done"].to_numpy()
    ttft = (first - sent) / NS
    e2e = (done - sent) / NS
    out_tokens = r["output_tokens"].to_numpy()
    ok = (r["outcome"] == "ok").to_numpy()
    tpot = np.where(out_tokens > 1, (e2e - ttft) / np.maximum(out_tokens - 1, 1), np.nan)
    max_gap = np.full(n, np.nan)
    if len(gaps):
        np.fmax.at(max_gap, gaps["code"].to_numpy(), gaps["gap_s"].to_numpy())
    in_window = (sent >= window.t_start) & (sent <= window.t_end) & ~r["is_warmup"].to_numpy()
    sent_ns = pd.array(np.where(np.isnan(sent), 0, sent).astype(np.int64) + lc.origin_ns)
    sent_ns[np.isnan(sent)] = pd.NA
    client_wait = (sent - r["t_created"].to_numpy()) / NS
    lateness = (r["t_created"].to_numpy() - r["t_scheduled_send"].to_numpy()) / NS
    e2e_ok = np.where(ok, e2e, np.nan)
    return pd.DataFrame(
        {
            "request_id": r["request_id"],
            "outcome": r["outcome"],
            "is_warmup": r["is_warmup"],
            "in_window": in_window,
            "sent_ns": sent_ns,
            "prompt_tokens": r["prompt_tokens"],
            "output_tokens": out_tokens,
            "n_chunks": r["n_chunks"],
            "ttft_s": ttft,
            "tpot_s": np.where(ok, tpot, np.nan),
            "e2e_s": e2e_ok,
            "max_itl_s": max_gap,
            "client_wait_s": client_wait,
            "lateness_s": lateness,
            # From when the request was due to its end: E2E plus any wait at the client
            # (a concurrency cap, a late schedule) — what a user of an open loop waits.
            "due_e2e_s": e2e_ok
            + np.maximum(np.nan_to_num(lateness), 0)
            + np.maximum(np.nan_to_num(client_wait), 0),
        }
    )


def serving_metrics(lc: Lifecycle, window: Window, slo: Slo | None = None) -> ServingMetrics:
    gaps = delivery_gaps(lc)
    pr = per_request(lc, window, gaps)
    sel = pr["in_window"].to_numpy()
    s = pr[sel]
    counts = s["outcome"].value_counts()
    n = int(sel.sum())

    def count(name: str) -> int:
        return int(counts.get(name, 0))

    outcomes = Outcomes(
        n,
        *(count(k) for k in ("ok", "cancelled", "timeout", "rejected", "error", "unfinished")),
        warmup_excluded=int(pr["is_warmup"].sum()),
    )
    rates = Rates(*(_ratio(count(k), n) for k in ("error", "rejected", "cancelled", "timeout")))
    g_sel = sel[gaps["code"].to_numpy()] if len(gaps) else np.zeros(0, dtype=bool)
    g = gaps[g_sel]
    return ServingMetrics(
        basis=lc.basis,
        window=window,
        outcomes=outcomes,
        rates=rates,
        throughput=_throughput(lc, window, pr),
        ttft_s=Dist.of(s["ttft_s"]),
        tpot_s=Dist.of(s["tpot_s"]),
        e2e_s=Dist.of(s["e2e_s"]),
        itl_per_chunk_s=Dist.of(g["gap_s"]),
        itl_per_token_s=Dist.of(_per_token_itl(lc, g, sel)),
        tokens_per_chunk=Dist.of(lc.deliveries["tokens"].to_numpy()[sel[lc.deliveries["code"]]]),
        prompt_tokens=Dist.of(s["prompt_tokens"]),
        output_tokens=Dist.of(s["output_tokens"][s["outcome"] == "ok"]),
        goodput=None if slo is None else _goodput(slo, pr, lc, window),
        per_request=pr,
        gaps=gaps,
    )


def _per_token_itl(lc: Lifecycle, g: pd.DataFrame, sel: np.ndarray) -> np.ndarray:
    """A chunk of k tokens after a gap g gives k per-token gaps of g/k; the extra tokens of
    a request's first chunk arrived with the first token (gap 0). So the per-token gaps
    of a request sum to last delivery − first delivery over N − 1 tokens."""
    k = g["tokens"].to_numpy()
    spread = np.repeat(g["gap_s"].to_numpy() / np.maximum(k, 1), np.maximum(k, 1).astype(int))
    d = lc.deliveries
    code = d["code"].to_numpy()
    first = np.r_[True, code[1:] != code[:-1]] if len(code) else np.zeros(0, dtype=bool)
    extra = (d["tokens"].to_numpy()[first] - 1).clip(min=0).astype(int)
    extra = extra[sel[code[first]]]
    return np.concatenate((spread, np.zeros(int(extra.sum()))))


def _throughput(lc: Lifecycle, window: Window, pr: pd.DataFrame) -> Throughput:
    a, b = window.t_start, window.t_end
    measured = ~pr["is_warmup"].to_numpy()
    d = lc.deliveries
    inside = (d["t"].to_numpy() >= a) & (d["t"].to_numpy() <= b) & measured[d["code"]]
    out_tokens = int(d["tokens"].to_numpy()[inside].sum())
    r = lc.requests
    first_in = _between(r["t_first"].to_numpy(), a, b) & measured
    in_tokens = int(np.nansum(r["prompt_tokens"].to_numpy()[first_in]))
    ok = (pr["outcome"] == "ok").to_numpy()
    completed = int((_between(r["t_done"].to_numpy(), a, b) & measured & ok).sum())
    dur = window.duration_s
    return Throughput(
        window_s=dur,
        output_tokens=out_tokens,
        input_tokens=in_tokens,
        completed=completed,
        output_tokens_per_s=_ratio(out_tokens, dur),
        total_tokens_per_s=_ratio(out_tokens + in_tokens, dur),
        requests_per_s=_ratio(completed, dur),
    )


def _goodput(slo: Slo, pr: pd.DataFrame, lc: Lifecycle, window: Window) -> Goodput:
    verdict = judge(slo, pr)
    sel = pr["in_window"].to_numpy()
    judged = sel & (pr["outcome"] != "cancelled").to_numpy()
    good = verdict["good"].to_numpy()
    ok = (pr["outcome"] == "ok").to_numpy()
    measured = ~pr["is_warmup"].to_numpy()
    done_in = _between(lc.requests["t_done"].to_numpy(), window.t_start, window.t_end)
    good_done = good & done_in & measured
    tokens = np.nansum(pr["output_tokens"].to_numpy()[good_done])

    def missed(name: str) -> int:
        col = f"meets_{name}"
        return int((judged & ok & ~verdict[col].to_numpy()).sum()) if col in verdict else 0

    n_judged = int(judged.sum())
    n_good = int((good & judged).sum())
    return Goodput(
        slo=slo,
        judged=n_judged,
        good=n_good,
        attainment=_ratio(n_good, n_judged),
        requests_per_s=_ratio(int(good_done.sum()), window.duration_s),
        output_tokens_per_s=_ratio(float(tokens), window.duration_s),
        missed_failed=int((judged & ~ok).sum()),
        missed_ttft=missed("ttft"),
        missed_tpot=missed("tpot"),
        missed_itl=missed("itl"),
        missed_e2e=missed("e2e"),
    )


def _between(t: np.ndarray, a: float, b: float) -> np.ndarray:
    return (t >= a) & (t <= b)


def _ratio(num: float, den: float) -> float:
    return float(num) / den if den > 0 else float("nan")
