"""Data-parallel replicas (`perfdiag run --dp N`): per-replica load, latency and cache
hits, how unevenly the router spread the work, and what that cost.

A replicated run's steps and requests carry `replica` (docs/run-format.md); step ids are
unique across replicas. Everything here is per replica from those columns:

- load: the tokens routed to a replica (prompt + output of the requests it served);
  imbalance = max / mean over replicas (1.0: even);
- busy: the replica's step time over the run's step span;
- queue: engine-side time from `queued` to first `scheduled`; TTFT and ITL from the
  client's view (lifecycle.py);
- excess, the severity model of the `dp-imbalance` check: the time the replica with the
  most work spent on work beyond an even share, `busy × (1 − mean load / its load)`, as
  a share of the run's step span — time a balanced router would have spread over the
  others (step time taken as proportional to the tokens a replica was given);
- lost capacity: the time a replica had no request at all while another replica held
  requests back (its steps ran with `num_waiting > 0`), summed over replicas;
- router effects: a shared-prefix group whose requests land on k replicas computes its
  prefix k times; a prefix-aware router (one replica per group) computes it once, so
  (k − 1) × the prefix's full blocks are hits the routing gave away.

`busiest_replica` and `step_lanes` serve the analyses that read the steps table as one
engine's sequence (the step timeline, the trust gate's overlap check, host gaps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..traces.reader import Run
from .intervals import union
from .lifecycle import Lifecycle, Missing, build_lifecycle
from .run_config import section
from .steady_state import INTERNAL

NS = 1e9
REPLICA_COLUMNS = [
    "replica", "requests", "prompt_tokens", "output_tokens", "load_tokens", "load_share",
    "steps", "busy_s", "busy_share", "queue_mean_s", "queue_p99_s", "ttft_p50_s",
    "ttft_p99_s", "itl_p50_s", "itl_p99_s", "cached_tokens", "prefix_hit_rate",
    "kv_peak_share", "waiting_steps_share",
]  # fmt: skip


def replicas_of(steps: pd.DataFrame) -> list[int]:
    """The replica ids a run's steps carry ([] for a run of one engine)."""
    if "replica" not in steps or not len(steps):
        return []
    return sorted(int(r) for r in steps["replica"].dropna().unique())


def busiest_replica(steps: pd.DataFrame) -> int | None:
    """The replica with the most step time (None unless several replicas stepped): the
    one whose timeline analyses that follow one engine's steps follow."""
    if len(replicas_of(steps)) < 2:
        return None
    dur = (steps["end_ns"] - steps["start_ns"]).groupby(steps["replica"]).sum()
    return int(dur.idxmax())


def step_lanes(steps: pd.DataFrame) -> np.ndarray:
    """A code per row naming the sequence the step belongs to: steps of one lane run one
    after another; different lanes (ranks, replicas) run side by side."""
    rank = steps["rank"].to_numpy("float64", na_value=-1.0)
    if "replica" not in steps:
        return rank.astype(np.int64)
    replica = steps["replica"].to_numpy("float64", na_value=-1.0)
    return ((replica + 1) * 1_000_003 + rank).astype(np.int64)


@dataclass(frozen=True)
class ReplicaAnalysis:
    replicas: int
    router: str | None  # the policy the run recorded
    per_replica: pd.DataFrame  # REPLICA_COLUMNS
    imbalance: float  # max / mean load (tokens routed)
    busiest: int  # the replica with the most load
    idlest: int
    balanced_imbalance: float  # max / mean if each request had gone to the least-loaded
    span_s: float  # first step start to last step end
    excess_s: float  # the busiest replica's busy time beyond an even share of the work
    excess_share: float  # excess_s / span: the dp-imbalance check's value
    lost_s: float  # replica-seconds idle while another replica held requests back
    lost_share: float  # lost_s / (replicas × span)
    queue_excess_s: float  # busiest replica's mean queue time minus the others'
    ttft_excess_s: float  # busiest replica's TTFT p50 minus the others' (pooled)
    prefix_groups: int  # shared-prefix groups with requests on some replica
    scattered_groups: int  # of them, on more than one replica
    prefix_tokens_lost: int  # (replicas a group used − 1) × its prefix's full blocks' tokens
    cached_tokens: int  # prefix-cache hits the run got
    lanes: pd.DataFrame = field(metadata=INTERNAL)  # replica, lost_s (idle while others queued)


def analyze_replicas(run: Run, lc: Lifecycle | Missing | None = None) -> ReplicaAnalysis | None:
    """None for a run without several replicas' steps."""
    steps = run.steps
    ids = replicas_of(steps)
    if len(ids) < 2:
        return None
    lc = build_lifecycle(run) if lc is None else lc
    reqs = _requests(run, lc)
    n = len(ids)
    t0, t1 = int(steps["start_ns"].min()), int(steps["end_ns"].max())
    span = max(t1 - t0, 1)
    rows = []
    for r in ids:
        s = steps[steps["replica"].eq(r).fillna(False).to_numpy()]
        q = reqs[reqs["replica"] == r]
        rows.append(_replica_row(r, s, q, span))
    per = pd.DataFrame(rows, columns=REPLICA_COLUMNS)
    load = per["load_tokens"].to_numpy(np.float64)
    mean = load.mean()
    per["load_share"] = load / load.sum() if load.sum() else np.nan
    busiest, idlest = int(per["replica"][np.argmax(load)]), int(per["replica"][np.argmin(load)])
    lanes = _lost(steps, reqs, ids, t0, t1)
    lost = float(lanes["lost_s"].sum())
    heavy = per.loc[per["replica"] == busiest].iloc[0]
    excess = float(heavy["busy_s"]) * float(1.0 - mean / load.max()) if load.max() > 0 else 0.0
    others = reqs[(reqs["replica"] != busiest) & reqs["replica"].notna()]
    mine = reqs[reqs["replica"] == busiest]
    groups = _prefix_groups(run, reqs)
    policy = (run.manifest.config or {}).get("data_parallel", {}) or {}
    return ReplicaAnalysis(
        replicas=n,
        router=policy.get("router"),
        per_replica=per,
        imbalance=float(load.max() / mean) if mean > 0 else 1.0,
        busiest=busiest,
        idlest=idlest,
        balanced_imbalance=_balanced(reqs, n),
        span_s=span / NS,
        excess_s=excess,
        excess_share=excess / (span / NS),
        lost_s=lost,
        lost_share=lost / (n * span / NS),
        queue_excess_s=_nanmean(mine["queue_s"]) - _nanmean(others["queue_s"]),
        ttft_excess_s=_nanmedian(mine["ttft_s"]) - _nanmedian(others["ttft_s"]),
        prefix_groups=groups[0],
        scattered_groups=groups[1],
        prefix_tokens_lost=groups[2],
        cached_tokens=int(reqs["cached_tokens"].fillna(0).sum()),
        lanes=lanes,
    )


def _requests(run: Run, lc: Lifecycle | Missing) -> pd.DataFrame:
    """One row per request: replica, tokens, cached, prefix group, queue time, TTFT, ITLs."""
    req = run.requests
    cols = ["request_id", "replica", "prompt_tokens", "output_tokens", "cached_tokens",
            "prefix_group", "is_warmup"]  # fmt: skip
    out = req[[c for c in cols if c in req]].copy()
    for c in cols[1:6]:
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    ev = run.request_events
    eng = ev[ev["side"] == "engine"]
    first = eng.pivot_table(index="request_id", columns="kind", values="ts_ns", aggfunc="min",
                            observed=True)  # fmt: skip
    queued = first.get("queued", pd.Series(dtype="float64"))
    sched = first.get("scheduled", pd.Series(dtype="float64"))
    out["queue_s"] = ((sched - queued) / NS).reindex(out["request_id"]).to_numpy()
    span = eng.groupby("request_id", observed=True)["ts_ns"].agg(["min", "max"])
    span = span.reindex(out["request_id"])
    out["t_in"], out["t_out"] = span["min"].to_numpy("float64"), span["max"].to_numpy("float64")
    out["ttft_s"] = np.nan
    out["itl"] = [np.empty(0)] * len(out)
    if isinstance(lc, Lifecycle):
        lr = lc.requests
        ttft = pd.Series(((lr["t_first"] - lr["t_sent"]) / NS).to_numpy(),
                         index=lr["request_id"].astype(str))  # fmt: skip
        out["ttft_s"] = ttft.reindex(out["request_id"].astype(str)).to_numpy()
        d = lc.deliveries
        if len(d):
            t, code = d["t"].to_numpy(np.float64), d["code"].to_numpy(np.int64)
            same = code[1:] == code[:-1]
            gaps = pd.Series((t[1:] - t[:-1])[same] / NS).groupby(code[1:][same]).agg(np.array)
            by_id = pd.Series(gaps.to_numpy(), index=lr["request_id"].astype(str).to_numpy()[
                gaps.index.to_numpy()])  # fmt: skip
            got = by_id.reindex(out["request_id"].astype(str))
            out["itl"] = [g if isinstance(g, np.ndarray) else np.empty(0) for g in got]
    return out


def _replica_row(r: int, s: pd.DataFrame, q: pd.DataFrame, span: int) -> list:
    busy = float((s["end_ns"] - s["start_ns"]).sum())
    prompt = float(q["prompt_tokens"].fillna(0).sum())
    output = float(q["output_tokens"].fillna(0).sum())
    cached = float(q["cached_tokens"].fillna(0).sum())
    itl = np.concatenate(list(q["itl"])) if len(q) else np.empty(0)
    used = s["kv_blocks_used"].to_numpy("float64", na_value=np.nan)
    pool = used + s["kv_blocks_free"].to_numpy("float64", na_value=np.nan)
    kv_peak = float(np.nanmax(used / pool)) if len(s) and np.isfinite(used / pool).any() else np.nan
    waiting = s["num_waiting"].to_numpy("float64", na_value=0.0)
    return [
        r, len(q), prompt, output, prompt + output, np.nan, len(s), busy / NS, busy / span,
        _nanmean(q["queue_s"]), _pct(q["queue_s"], 99), _pct(q["ttft_s"], 50),
        _pct(q["ttft_s"], 99), _pct(itl, 50), _pct(itl, 99), cached,
        cached / prompt if prompt else np.nan, kv_peak,
        float((waiting > 0).mean()) if len(s) else np.nan,
    ]  # fmt: skip


def _lost(steps, reqs, ids, t0: int, t1: int) -> pd.DataFrame:
    """Per replica: time it had no request while another replica held some back."""
    ev_t = _in_system(reqs)
    rows = []
    for r in ids:
        held = []
        for other in ids:
            if other == r:
                continue
            s = steps[steps["replica"].eq(other).fillna(False).to_numpy()].sort_values("start_ns")
            start = s["start_ns"].to_numpy(np.int64)
            nxt = np.r_[start[1:], s["end_ns"].to_numpy(np.int64)[-1:]]
            w = s["num_waiting"].to_numpy("float64", na_value=0.0) > 0
            held.append((start[w], np.maximum(nxt[w], s["end_ns"].to_numpy(np.int64)[w])))
        if held:
            hs = np.concatenate([h[0] for h in held])
            he = np.concatenate([h[1] for h in held])
        else:
            hs = he = np.empty(0, np.int64)
        waiting = union(hs, he)
        busy = ev_t.get(r, union(np.empty(0, np.int64), np.empty(0, np.int64)))
        # idle = span − busy; |idle ∩ waiting| = |waiting| − |busy ∩ waiting| (inside span)
        cov_w = waiting.coverage().between(np.array([t0]), np.array([t1]))[0]
        both = union(np.r_[waiting.start, busy.start], np.r_[waiting.end, busy.end])
        cov_b = busy.coverage().between(np.array([t0]), np.array([t1]))[0]
        cov_u = both.coverage().between(np.array([t0]), np.array([t1]))[0]
        overlap = cov_w + cov_b - cov_u
        rows.append((r, max(cov_w - overlap, 0) / NS))
    return pd.DataFrame(rows, columns=["replica", "lost_s"])


def _in_system(reqs: pd.DataFrame) -> dict:
    """Per replica, when it had at least one request: the union of its requests' first to
    last engine event (arrival to finish)."""
    out = {}
    ok = reqs.dropna(subset=["replica", "t_in", "t_out"])
    for r, q in ok.groupby("replica"):
        out[int(r)] = union(q["t_in"].to_numpy(np.int64), q["t_out"].to_numpy(np.int64))
    return out


def _balanced(reqs: pd.DataFrame, n: int) -> float:
    """max / mean load had each request (in arrival order) gone to the replica with the
    least work routed so far: what a load-aware router reaches on this workload."""
    work = (reqs["prompt_tokens"].fillna(0) + reqs["output_tokens"].fillna(0)).to_numpy()
    if not len(work) or not work.sum():
        return 1.0
    load = np.zeros(n)
    for w in work:
        load[np.argmin(load)] += w
    return float(load.max() / load.mean())


def _prefix_groups(run: Run, reqs: pd.DataFrame) -> tuple[int, int, int]:
    """(groups served, groups on more than one replica, prefix tokens recomputed because
    of that: (replicas − 1) × the prefix's full-block tokens per group)."""
    g = reqs.dropna(subset=["prefix_group", "replica"])
    if not len(g):
        return 0, 0, 0
    config = run.manifest.config or {}
    prefix = (section(config, "run_options", "workload") or {}).get("shared_prefix") or {}
    block = (section(config, "run_options", "engine") or {}).get("block_size") or 16
    length = int(prefix.get("length") or 0) // int(block) * int(block)
    spread = g.groupby("prefix_group")["replica"].nunique()
    return len(spread), int((spread > 1).sum()), int((spread - 1).sum() * length)


def _nanmean(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def _nanmedian(x) -> float:
    return _pct(x, 50)


def _pct(x, p: float) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(np.percentile(x, p)) if len(x) else float("nan")
