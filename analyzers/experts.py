"""Mixture-of-experts load: tokens per expert per step, hot experts, load per rank under the
run's placement, the time the imbalance costs, and a placement that would balance it.

The engine records, per step, every (layer, expert)'s routed tokens as counters named
`expert_tokens`, scoped `layer{L}/expert{E}/rank{R}` (R: the rank holding the expert), at
the step's start time (its row's `start_ns`: how a counter finds its step).

The cost model. With experts placed on ranks (expert parallelism), every MoE layer ends in
one combine (an all_reduce) that no rank leaves before the last one enters, so a layer
takes as long as its busiest rank's experts: the imbalance costs, per step and layer,
`(max_r − mean_r) tokens on rank r × c`, against a placement where every rank carried the
mean. `c`, the time one token spends in one expert, is the run's own: the slope of each
rank's wait at a MoE combine against how many fewer tokens its experts had than the
busiest rank's (least squares with an intercept per rank, which takes up a rank's
lateness for other reasons), when the run has per-rank collectives;
otherwise the step time per token × the routed experts' share of a token's FLOPs. On one
rank nothing waits: the same expert-tokens are computed, in fewer and larger GEMMs.

Pure pandas over a run; no torch.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from . import collectives
from .run_config import section

COUNTER = "expert_tokens"
LOAD_COLUMNS = ["step_id", "layer", "expert", "rank", "tokens"]


def expert_loads(run) -> pd.DataFrame:
    """One row per step, layer and expert: tokens routed to it and the rank holding it
    (empty when the run recorded no expert loads)."""
    c = run.counters
    if not len(c):
        return _empty()
    c = c[(c["name"] == COUNTER).to_numpy()]
    steps = _steps(run)
    if not len(c) or not len(steps):
        return _empty()
    # Parse each distinct scope once (a categorical: few values, many rows).
    scopes = pd.Series(c["scope"].astype(str).unique())
    parts = scopes.str.extract(r"^layer(\d+)/expert(\d+)(?:/rank(\d+))?$")
    ok = parts[0].notna().to_numpy() & parts[1].notna().to_numpy()
    table = pd.DataFrame(
        {
            "layer": parts[0].where(ok).astype(float).to_numpy(),
            "expert": parts[1].where(ok).astype(float).to_numpy(),
            "rank": parts[2].where(ok).fillna(0).astype(float).to_numpy(),
        },
        index=scopes.to_numpy(),
    )
    row = table.loc[c["scope"].astype(str).to_numpy()]
    step_of = pd.Series(steps["step_id"].to_numpy(), index=steps["start_ns"].to_numpy())
    step_of = step_of[~step_of.index.duplicated()]
    step = step_of.reindex(c["ts_ns"].to_numpy()).to_numpy()
    df = pd.DataFrame(
        {
            "step_id": step,
            "layer": row["layer"].to_numpy(),
            "expert": row["expert"].to_numpy(),
            "rank": row["rank"].to_numpy(),
            "tokens": c["value"].to_numpy(),
        }
    ).dropna()
    if not len(df):
        return _empty()
    df = df.astype("int64").sort_values(["step_id", "layer", "expert"], ignore_index=True)
    return df[LOAD_COLUMNS]


def _empty() -> pd.DataFrame:
    return pd.DataFrame({k: pd.Series(dtype="int64") for k in LOAD_COLUMNS})


def _steps(run) -> pd.DataFrame:
    """The scheduling rank's steps (rank 0's, or the only rank's)."""
    st = run.steps
    if len(st) and st["rank"].notna().any():
        st = st[st["rank"].eq(st["rank"].min()).fillna(False).to_numpy()]
    return st


def placement(run, loads: pd.DataFrame) -> np.ndarray:
    """The rank of each expert: the manifest's `config.parallel.expert_placement`, else
    the rank its counters name."""
    recorded = section(run.manifest.config, "parallel").get("expert_placement")
    num = int(loads["expert"].max()) + 1
    if (isinstance(recorded, list) and len(recorded) == num
            and all(isinstance(x, int) and 0 <= x < 4096 for x in recorded)):  # fmt: skip
        return np.asarray(recorded, dtype=np.int64)
    first = loads.drop_duplicates("expert").set_index("expert")["rank"]
    return first.reindex(range(num)).fillna(0).to_numpy(np.int64)


def rank_loads(loads: pd.DataFrame, where: np.ndarray, ranks: int) -> np.ndarray:
    """[steps, layers, ranks] tokens each rank's experts received, under `where`
    (expert → rank), steps and layers in sorted order."""
    steps = np.sort(loads["step_id"].unique())
    layers = int(loads["layer"].max()) + 1
    s = np.searchsorted(steps, loads["step_id"].to_numpy())
    out = np.zeros((len(steps), layers, ranks))
    np.add.at(out, (s, loads["layer"].to_numpy(), where[loads["expert"].to_numpy()]),
              loads["tokens"].to_numpy(np.float64))  # fmt: skip
    return out


def excess(per_rank: np.ndarray) -> float:
    """Σ over steps and layers of (busiest rank − mean rank) tokens: what waits."""
    if per_rank.size == 0:
        return 0.0
    return float((per_rank.max(axis=2) - per_rank.mean(axis=2)).sum())


def balanced_placement(totals: np.ndarray, ranks: int) -> np.ndarray:
    """Expert → rank, E / ranks experts per rank, balancing `totals` (tokens per expert):
    the heaviest expert first onto the least-loaded rank with room (LPT)."""
    per = len(totals) // ranks
    load, room = np.zeros(ranks), np.full(ranks, per)
    out = np.zeros(len(totals), dtype=np.int64)
    for e in np.argsort(-totals, kind="stable"):
        r = int(np.argmin(np.where(room > 0, load, np.inf)))
        out[e], load[r], room[r] = r, load[r] + totals[e], room[r] - 1
    return out


def per_step(loads: pd.DataFrame, where: np.ndarray) -> pd.DataFrame:
    """Per step: tokens routed, the busiest expert (its layer-summed tokens) against the
    mean, and the busiest rank against the mean rank."""
    cols = ["step_id", "routed", "max_expert", "mean_expert", "hot_expert", "max_rank",
            "mean_rank", "hot_rank"]  # fmt: skip
    if not len(loads):
        return pd.DataFrame(columns=cols)
    by_e = loads.groupby(["step_id", "expert"])["tokens"].sum().unstack(fill_value=0)
    ranks = int(where.max()) + 1
    by_r = np.zeros((len(by_e), ranks))
    for e in by_e.columns:
        by_r[:, where[e]] += by_e[e].to_numpy()
    out = pd.DataFrame(
        {
            "step_id": by_e.index.to_numpy(),
            "routed": by_e.sum(axis=1).to_numpy(),
            "max_expert": by_e.max(axis=1).to_numpy(),
            "mean_expert": by_e.mean(axis=1).to_numpy(),
            "hot_expert": by_e.idxmax(axis=1).to_numpy(),
            "max_rank": by_r.max(axis=1),
            "mean_rank": by_r.mean(axis=1),
            "hot_rank": by_r.argmax(axis=1),
        }
    )
    return out[cols]


class ExpertSummary(NamedTuple):
    steps: int
    layers: int
    experts: int
    ranks: int
    top_k: int
    routed: int  # token-expert assignments over the run, all layers
    max_mean: float  # busiest expert's tokens / mean, per layer over the run (mean of layers)
    step_max_mean: float  # the same per step, averaged weighted by tokens
    hot: list  # (expert, share of routed tokens) of the experts above 1.5× uniform, hottest first
    hot_layer: tuple  # (layer, expert, share of that layer's tokens): the single hottest
    placement: list  # expert → rank
    rank_share: list  # share of routed tokens per rank
    hot_rank: int  # the rank with the most expert work over the run
    rank_max_mean: float  # per step and layer, busiest rank / mean rank (token-weighted)
    us_per_token: float  # c: one token in one expert (µs)
    cost_source: str  # how c was measured
    cost_ms: float  # step time the imbalance cost over the run
    step_ms: float  # step time over the run
    cost_share: float  # cost_ms / step_ms
    balanced: list  # a placement that balances the measured loads
    balanced_max_mean: float  # its predicted busiest/mean rank (per step and layer)
    balanced_cost_share: float  # its predicted cost
    replicate: int | None  # an expert whose load alone exceeds a rank's fair share
    replicated_max_mean: float  # predicted with that expert on every rank (load split)
    contiguous2_max_mean: float  # one rank: busiest/mean rank were it split over 2, contiguously
    rank_wait_ms: dict  # rank → waiting in collectives (analyzers/collectives.py)
    combine_wait_ms: dict  # rank → of which at the MoE combines: the experts' share
    # rank → CPU seconds its process got per second of forward (collectives.rank_hosts):
    # on a CPU run, together fewer than the ranks means they never computed in parallel
    rank_cpu_per_s: dict


def _max_mean(per_rank: np.ndarray) -> float:
    mean = per_rank.mean(axis=2)
    w = mean.sum()
    return float((per_rank.max(axis=2)).sum() / w) if w else float("nan")


def summarize(run, loads: pd.DataFrame | None = None) -> ExpertSummary | None:
    """The run's expert load in a few numbers; None without recorded expert loads."""
    loads = expert_loads(run) if loads is None else loads
    if not len(loads):
        return None
    where = placement(run, loads)
    experts, ranks = len(where), int(where.max()) + 1
    par = section(run.manifest.config, "parallel")
    ranks = max(ranks, _int(par.get("expert_parallel_size"), 1))
    layers = int(loads["layer"].max()) + 1
    totals_le = loads.groupby(["layer", "expert"])["tokens"].sum().unstack(fill_value=0)
    totals_le = totals_le.reindex(columns=range(experts), fill_value=0)
    routed = int(totals_le.to_numpy().sum())
    per_layer = totals_le.max(axis=1) / totals_le.mean(axis=1).where(totals_le.mean(axis=1) > 0)
    per_sl = loads.groupby(["step_id", "layer"])["tokens"]
    sl = pd.DataFrame({"max": per_sl.max(), "mean": per_sl.mean()})
    totals = totals_le.sum(axis=0).to_numpy(np.float64)
    shares = totals / totals.sum() if totals.sum() else totals
    hot = [(int(e), float(shares[e])) for e in np.argsort(-shares, kind="stable")
           if shares[e] > 1.5 / experts][:3]  # fmt: skip
    flat = totals_le.stack()
    (hl, he) = flat.idxmax()
    layer_sum = float(totals_le.loc[hl].sum())
    per_rank = rank_loads(loads, where, ranks)
    rank_tot = per_rank.sum(axis=(0, 1))
    steps = _steps(run)
    step_ns = float((steps["end_ns"] - steps["start_ns"]).sum())
    samples = _combine_samples(run, per_rank, loads)
    c_ns, source = _token_cost(samples, steps, routed, run)
    combine_wait = {} if samples is None else {
        int(x): float(samples[2][samples[0] == x].sum()) / 1e6 for x in np.unique(samples[0])
    }  # fmt: skip
    cost_ns = excess(per_rank) * c_ns if ranks > 1 else 0.0
    balanced = balanced_placement(totals, ranks) if ranks > 1 else where
    bal_rank = rank_loads(loads, balanced, ranks)
    replicate, rep_mm = None, float("nan")
    if ranks > 1 and totals.max() > totals.sum() / ranks:
        replicate = int(np.argmax(totals))
        rep_mm = _replicated_max_mean(loads, balanced, ranks, replicate)
    comm = collectives.summarize(run) if ranks > 1 else None
    return ExpertSummary(
        steps=int(loads["step_id"].nunique()),
        layers=layers,
        experts=experts,
        ranks=ranks,
        top_k=_top_k(run, loads),
        routed=routed,
        max_mean=float(per_layer.mean()),
        step_max_mean=float((sl["max"]).sum() / sl["mean"].sum()) if sl["mean"].sum() else 1.0,
        hot=hot,
        hot_layer=(int(hl), int(he), float(flat.max()) / layer_sum if layer_sum else 0.0),
        placement=[int(r) for r in where],
        rank_share=[float(x) for x in rank_tot / rank_tot.sum()] if rank_tot.sum() else [],
        hot_rank=int(np.argmax(rank_tot)),
        rank_max_mean=_max_mean(per_rank),
        us_per_token=c_ns / 1e3,
        cost_source=source,
        cost_ms=cost_ns / 1e6,
        step_ms=step_ns / 1e6,
        cost_share=cost_ns / step_ns if step_ns else 0.0,
        balanced=[int(r) for r in balanced],
        balanced_max_mean=_max_mean(bal_rank),
        balanced_cost_share=(excess(bal_rank) * c_ns / step_ns if step_ns and ranks > 1 else 0.0),
        replicate=replicate,
        replicated_max_mean=rep_mm,
        contiguous2_max_mean=(
            _max_mean(rank_loads(loads, np.arange(experts) * 2 // experts, 2))
            if experts >= 2
            else float("nan")
        ),
        rank_wait_ms={} if comm is None else comm.rank_wait_ms,
        combine_wait_ms=combine_wait,
        rank_cpu_per_s=_cpu_per_s(comm),
    )


def _cpu_per_s(comm) -> dict:
    if comm is None:
        return {}
    return {r: h.cpu_per_s for r, h in comm.hosts.items() if np.isfinite(h.cpu_per_s)}


def _replicated_max_mean(loads, where, ranks: int, expert: int) -> float:
    """Busiest / mean rank with `expert` on every rank, its tokens split evenly."""
    hot = loads["expert"].to_numpy() == expert
    rest = rank_loads(loads[~hot], where, ranks)
    spread = rank_loads(loads[hot], np.zeros(len(where), dtype=np.int64), 1)
    return _max_mean(rest + spread / ranks)


def _top_k(run, loads: pd.DataFrame) -> int:
    """Experts per token: from the recorded model config, else routed / tokens."""
    from .roofline import find_model_config

    model = find_model_config(run.manifest.config or {}) or {}
    k = _int(model.get("num_experts_per_tok"), 0)
    if k > 0:
        return k
    st = _steps(run)
    tokens = float((st["num_prefill_tokens"] + st["num_decode_seqs"]).sum())
    layers = int(loads["layer"].max()) + 1
    return round(float(loads["tokens"].sum()) / (tokens * layers)) if tokens else 0


def _token_cost(samples, steps, routed, run) -> tuple[float, str]:
    """ns one token spends in one expert: from the waits at MoE combines (multi-rank),
    else from the step time per routed token-expert × the experts' share of FLOPs."""
    if samples is not None:
        c = _price(*samples)
        if c is not None:
            return c, "waits at the MoE combines vs the token deficit (least squares)"
    step_ns = float((steps["end_ns"] - steps["start_ns"]).sum())
    share = _expert_flop_share(run)
    if not routed or share is None:
        return 0.0, "unknown"
    return step_ns * share / routed, "step time × the routed experts' share of FLOPs"


def _combine_samples(run, per_rank, loads):
    """(rank, token deficit, wait ns) of every rank at every MoE combine: its wait there,
    and how many fewer tokens its experts had than the busiest rank's in that layer.
    engine_ref's order: per layer, attention's all_reduce (seq 2l), then the MoE combine
    (seq 2l + 1). None without per-rank collectives."""
    if per_rank.shape[2] < 2:
        return None
    per = collectives.collective_spans(run.spans)
    layers = per_rank.shape[1]
    if not len(per):
        return None
    per = per[(per["seq"] % 2 == 1).to_numpy() & (per["seq"] < 2 * layers).to_numpy()]
    steps = np.sort(loads["step_id"].unique())
    s = np.searchsorted(steps, per["step_id"].to_numpy())
    ok = (s < len(steps)) & (steps[np.minimum(s, len(steps) - 1)] == per["step_id"].to_numpy())
    ok &= per["rank"].to_numpy() < per_rank.shape[2]
    if not ok.any():
        return None
    s, layer = s[ok], (per["seq"].to_numpy()[ok] // 2)
    r = per["rank"].to_numpy()[ok]
    deficit = per_rank.max(axis=2)[s, layer] - per_rank[s, layer, r]
    return r, deficit, per["wait_ns"].to_numpy()[ok].astype(np.float64)


def _price(r, deficit, wait) -> float | None:
    """Slope of the waits on the deficits. An intercept per rank: a rank late or early for
    other reasons (rank 0's host work, contention) waits that much whatever its deficit;
    through the origin that offset would read as expert cost, most where deficits are
    small (decode steps). One intercept for all when no rank's deficit varies."""
    for groups in (r, np.zeros_like(r)):
        dd, ww = deficit.astype(np.float64), wait.copy()
        for x in np.unique(groups):
            on = groups == x
            dd[on] -= dd[on].mean()
            ww[on] -= ww[on].mean()
        var = float((dd * dd).sum())
        if var > 0:
            return max(float((dd * ww).sum()) / var, 0.0)
    return None


def _expert_flop_share(run) -> float | None:
    """Routed experts' share of a token's linear-layer FLOPs (per active parameter)."""
    from .roofline import find_model_config

    m = find_model_config(run.manifest.config or {}) or {}
    try:
        h, inter = int(m["hidden_size"]), int(m["moe_intermediate_size"])
        k, layers = (
            int(m["num_experts_per_tok"]),
            int(m.get("num_layers") or m["num_hidden_layers"]),
        )
        heads, kv = int(m.get("num_heads") or 1), int(m.get("num_kv_heads") or 1)
        d = int(m.get("head_dim") or h // max(heads, 1))
        shared = int(m.get("shared_expert_intermediate_size") or 0)
        experts_n, vocab = int(m.get("num_experts") or 0), int(m.get("vocab_size") or 0)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None  # a manifest edited by hand or written by another tool
    attn = h * (heads + 2 * kv) * d + heads * d * h
    experts = k * 3 * h * inter
    dense = attn + 3 * h * shared + h * experts_n
    total = layers * (experts + dense) + h * vocab
    return layers * experts / total if total > 0 else None


def _int(value, default: int) -> int:
    """A manifest's integer, or `default` when it holds something else."""
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError, OverflowError):
        return default
