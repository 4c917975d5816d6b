"""The gate's view of perfdiag's own load client: did it stall, and which of the latencies
it measured are its own delay rather than the server's?

`perfdiag run --target/--launch` drives the server from one asyncio event loop
(probes/http_session.py). When that loop cannot run — its thread starved of CPU, a long
callback, the garbage collector — nothing is read from the sockets: every chunk that arrives
meanwhile is stamped when the loop runs again, the chunks of one stream arriving "bunched"
within a few ms, and the gap before them (or the TTFT) holds the stall. The client records
its loop's health per window (`LoopMonitor`: counters of scope "client", one row per
~0.25 s window stamped at the window's END, `client_loop_lag_max_s` the largest lateness
of its 10 ms timer in that window). An in-process `perfdiag run` records no such counters;
any run that has them is judged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analyzers.findings import IdList
from ..analyzers.impact import NO_IMPACT
from .facts import Fact, TriageContext, Unavailable, ev, fact, finite, itl_impact, ttft_impact

LAG = "client_loop_lag_max_s"
# A stall: a window whose loop lag reached 20 ms, the lag p99 from which LoopMonitor calls
# the client bound (http_session.LAG_P99_S). It is the order of the quantity it distorts:
# a decode step's gap is 10-50 ms on a GPU, so a 20 ms stall is a sizeable share of an
# ITL, and far above the lag of a healthy loop (p50 ~0.1 ms, p99 a few ms in the recorded
# vLLM runs, tests/data/vllm/runs/).
STALL_S = 0.02
WINDOW_S = 0.25  # LoopMonitor's window: how far back the first row's window reaches
# Chunks of one stream stamped closer than this were held and read together: a server
# sends a decode step's chunk at most once per step, and no gap this short was seen
# outside a stall window in the recorded vLLM runs (0 of ~10,000), hundreds inside them.
BUNCH_S = 0.002
SOURCE = "client (perfdiag's load generator's own event-loop lag)"


def stall_windows(run) -> pd.DataFrame | None:
    """The client's loop-health windows as start_ns, end_ns, lag_s (None: the run has no
    client loop-lag counter). A row's ts_ns is its window's end; the window began where
    the previous one ended (the first: WINDOW_S, or its lag if longer, before its end)."""
    c = run.counters
    if not len(c):
        return None
    named = (c["name"] == LAG).to_numpy(bool, na_value=False)
    sel = named & (c["scope"] == "client").to_numpy(bool, na_value=False)
    if not sel.any():
        return None
    rows = c[sel].sort_values("ts_ns", kind="stable")
    end = rows["ts_ns"].to_numpy(np.int64)
    lag = rows["value"].to_numpy(np.float64)
    start = np.empty_like(end)
    start[1:] = end[:-1]
    start[0] = end[0] - int(max(WINDOW_S, lag[0]) * 1e9)
    return pd.DataFrame({"start_ns": start, "end_ns": end, "lag_s": lag})


def _window_of(t: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each time (ns; NaN: none), the index of the window holding it, or -1.
    Windows are contiguous and sorted: (start_k, end_k], start_k = end_{k-1}."""
    t = np.asarray(t, dtype=np.float64)
    k = np.searchsorted(end, np.nan_to_num(t, nan=np.inf), side="left")
    inside = (k < len(end)) & np.isfinite(t)
    inside[inside] &= t[inside] > start[k[inside]]
    return np.where(inside, k, -1)


@dataclass(frozen=True)
class StallParts:
    """What the client's stalls may have added, per row of the serving metrics' tables."""

    windows: pd.DataFrame  # start_ns, end_ns, lag_s: every loop-health window
    stall: np.ndarray  # per window: its lag reached STALL_S
    touched: np.ndarray  # per request (metrics.per_request row): measured, and its send,
    # first token or a chunk stamped inside a stall
    bunched: np.ndarray  # per request: touched, with ≥ 3 chunks stamped < BUNCH_S apart
    ttft_s: np.ndarray  # per request: stall time its TTFT may hold
    gap_s: np.ndarray  # per gap (metrics.gaps row): stall time it may hold


def stall_parts(ctx: TriageContext) -> StallParts | Unavailable:
    """The client's stall windows and what they may have added to each request's TTFT and
    each gap between its chunks; Unavailable without client loop-lag counters."""
    windows = stall_windows(ctx.run)
    if windows is None and "client_shards" in ctx.run.manifest.extra:
        return Unavailable(
            "the load was split over client shards (--clients): each shard's loop health "
            "is its own (counters client/shardK, manifest client_health.shards)"
        )
    if windows is None:
        return Unavailable(
            "the run has no client health counters (client_loop_lag_max_s): only "
            "perfdiag run --target/--launch records its load client's event-loop lag"
        )
    m = ctx.get("metrics")
    if m is None:
        return ctx.missing("metrics")
    if m.basis != "client":
        return Unavailable("the run's latencies are the engine's own record, not the client's")
    pr, gaps = m.per_request, m.gaps
    origin = int(m.window.start_ns) - round(m.window.t_start)  # per-request times are relative
    stall = windows["lag_s"].to_numpy() >= STALL_S
    start = (windows["start_ns"].to_numpy(np.int64) - origin).astype(np.float64)
    end = (windows["end_ns"].to_numpy(np.int64) - origin).astype(np.float64)
    lag = windows["lag_s"].to_numpy() * 1e9

    def stalled(t: np.ndarray) -> np.ndarray:  # the stall window holding each time, or -1
        k = _window_of(t, start, end)
        return np.where((k >= 0) & stall[np.maximum(k, 0)], k, -1)

    sent = (pr["sent_ns"] - origin).to_numpy("float64", na_value=np.nan)  # exact in int64
    ttft = pr["ttft_s"].to_numpy(np.float64)
    first = sent + ttft * 1e9
    # TTFT holds a stall when its first token was stamped late (it arrived during the
    # stall: at most the lag, and only since the window began or the request was sent),
    # or when the send was stamped just before the loop stalled (the request went out late).
    ks, kf = stalled(sent), stalled(first)
    ttft_part = np.zeros(len(pr))
    at = kf >= 0
    ttft_part[at] = np.minimum(lag[kf[at]], first[at] - np.fmax(start[kf[at]], sent[at]))
    at = (ks >= 0) & (ks != kf)
    ttft_part[at] += np.minimum(lag[ks[at]], np.fmin(end[ks[at]], first[at]) - sent[at])
    ttft_part = np.clip(np.nan_to_num(ttft_part), 0.0, np.nan_to_num(ttft) * 1e9) / 1e9

    # A gap holds a stall when its later chunk was stamped inside one. A stall delays one
    # delivery per stream (the first the loop reads after it; the rest come bunched behind
    # it), so of a stream's gaps ending in one stall window only the longest is charged: at
    # most the lag, and only since the window began or the previous chunk came.
    code = gaps["code"].to_numpy(np.int64)
    t, t_prev = gaps["t"].to_numpy(np.float64), gaps["t_prev"].to_numpy(np.float64)
    gap_s = gaps["gap_s"].to_numpy(np.float64)
    kg = stalled(t)
    gap_part = np.zeros(len(gaps))
    hit = np.flatnonzero(kg >= 0)
    if len(hit):
        cand = pd.DataFrame({"i": hit, "code": code[hit], "k": kg[hit], "gap": gap_s[hit]})
        longest = cand.loc[cand.groupby(["code", "k"], sort=False)["gap"].idxmax(), "i"]
        i = longest.to_numpy(np.int64)
        gap_part[i] = np.minimum(lag[kg[i]], t[i] - np.fmax(start[kg[i]], t_prev[i])) / 1e9
        gap_part = np.clip(gap_part, 0.0, gap_s)

    touched = (ks >= 0) | (kf >= 0)
    touched[np.unique(code[hit])] = True
    touched &= pr["in_window"].to_numpy(bool)
    bunch = np.bincount(code[hit][gap_s[hit] < BUNCH_S], minlength=len(pr)) >= 2
    return StallParts(windows, stall, touched, touched & bunch, ttft_part, gap_part)


@fact(
    "client_stalls",
    provides=(
        "stalls",
        "total_ms",
        "largest_ms",
        "threshold_ms",
        "requests",
        "touched",
        "bunched",
        "ttft_p99_ms",
        "ttft_p99_untouched_ms",
        "itl_p99_ms",
        "itl_p99_untouched_ms",
        "ttft_share",
        "itl_share",
        "client_verdict",
        "source",
    ),
)
def client_stalls(ctx: TriageContext) -> Fact | Unavailable:
    """The share of the TTFT or ITL p99 that is the load client's own stalls: windows in
    which its event loop lagged ≥ 20 ms, and the measured requests whose send, first token
    or a chunk it stamped inside one (their latency may hold up to the stall).

    The value is the p99's drop with each request's (each gap's) stall time taken out —
    what the stalls did to the tail, bounded by how long they lasted — not the share of
    requests touched: a 30 ms stall touches every stream in flight, yet moves a 9 s TTFT
    by nothing, while one 2.4 s stall touching three requests is the whole p99."""
    parts = stall_parts(ctx)
    if isinstance(parts, Unavailable):
        return parts
    m = ctx.get("metrics")
    pr, gaps = m.per_request, m.gaps
    measured = pr["in_window"].to_numpy(bool)
    ttft = pr["ttft_s"].to_numpy(np.float64)
    code = gaps["code"].to_numpy(np.int64)
    gap_s = gaps["gap_s"].to_numpy(np.float64)
    touched = parts.touched
    charged = parts.ttft_s + np.bincount(code, parts.gap_s, minlength=len(pr))

    g_measured = measured[code] if len(code) else np.zeros(0, dtype=bool)
    per_req = pd.DataFrame({"ttft_s": ttft, "part": parts.ttft_s})[measured]
    t_imp = ttft_impact(ctx, per_req, "part")
    per_gap = pd.DataFrame({"code": code, "gap_s": gap_s, "part": parts.gap_s})[g_measured]
    i_imp = itl_impact(ctx, per_gap, "part") if len(per_gap) else NO_IMPACT
    value = max([0.0, *(x for x in (t_imp.tail_gain, i_imp.tail_gain) if finite(x))])
    lags = parts.windows["lag_s"].to_numpy()[parts.stall]
    keep = measured & ~touched
    g_keep = g_measured & ~touched[code] if len(code) else g_measured
    health = ctx.run.manifest.extra.get("client_health") or {}
    verdict = "; ".join(health.get("reasons") or []) or (
        "not flagged" if health else "not recorded"
    )
    evidence = (
        ev("stalls", "client stalls", int(parts.stall.sum())),
        ev("total_ms", "loop lag in them", float(lags.sum()) * 1e3, "ms"),
        ev("largest_ms", "largest", float(lags.max()) * 1e3 if len(lags) else 0.0, "ms"),
        ev("threshold_ms", "a stall from", STALL_S * 1e3, "ms"),
        ev("requests", "measured requests", int(measured.sum())),
        ev("touched", "stamped inside a stall", int(touched.sum())),
        ev("bunched", "chunks bunched after a stall", int(parts.bunched.sum())),
        ev("ttft_p99_ms", "TTFT p99", m.ttft_s.p99 * 1e3, "ms"),
        ev("ttft_p99_untouched_ms", "TTFT p99 without them", _p99_ms(ttft[keep]), "ms"),
        ev("itl_p99_ms", "ITL p99", m.itl_per_chunk_s.p99 * 1e3, "ms"),
        ev("itl_p99_untouched_ms", "ITL p99 without them", _p99_ms(gap_s[g_keep]), "ms"),
        ev("ttft_share", "TTFT p99 that is stall", t_imp.tail_gain, "%"),
        ev("itl_share", "ITL p99 that is stall", i_imp.tail_gain, "%"),
        ev("client_verdict", "the client's own verdict", verdict),
        ev("source", "source", SOURCE),
    )
    order = np.argsort(-charged, kind="stable")
    ids = (
        IdList("request", "stamped inside a client stall", _ids(pr, order, touched)),
        IdList("request", "chunks bunched after a client stall", _ids(pr, order, parts.bunched)),
    )
    # How loud: a stall that moves the tail qualifies the tail figures (a warning); it is
    # critical only where the impact rule of every latency cause (analyzers/impact.py) says
    # so: the client at least doubled what the typical request measured (or, with an SLO,
    # alone made a fifth of the requests miss it).
    critical = "critical" in (t_imp.max_severity, i_imp.max_severity)
    return Fact(
        value,
        evidence,
        ids,
        impact=min(1.0, value),
        max_severity="critical" if critical else "warning",
    )


def _p99_ms(values: np.ndarray) -> float:
    v = values[np.isfinite(values)]
    return float(np.percentile(v, 99)) * 1e3 if len(v) else float("nan")


def _ids(pr: pd.DataFrame, order: np.ndarray, chosen: np.ndarray, n: int = 5) -> tuple:
    rows = order[chosen[order]][:n]
    return tuple(str(v) for v in pr["request_id"].to_numpy()[rows])
