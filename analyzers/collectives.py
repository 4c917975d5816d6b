"""Collectives across ranks: each collective's transfer and waiting, comm share per step.

A collective cannot finish before its last rank enters it. For one collective (the same
`(step_id, seq)` on every rank, from `args.seq`) on aligned clocks:

- `last_start_ns` = the latest entry over the ranks; the rank that entered last is the
  one the others waited for (`slowest_rank`);
- a rank's **wait** = `last_start_ns − its start` (it sat in the call doing nothing);
- a rank's **transfer** = `its end − last_start_ns` (all ranks in: the data moved).

Clock alignment error (`manifest.config.parallel.clock_sync`, uncertainty per rank) bounds
how far wait and transfer can be trusted: a wait below it is noise.

Pure pandas over a run; no torch.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np
import pandas as pd

PER_RANK_COLUMNS = ["step_id", "seq", "rank", "name", "bytes", "start_ns", "end_ns",
                    "dur_ns", "wait_ns", "transfer_ns"]  # fmt: skip


COLLECTIVE_COLUMNS = ["step_id", "seq", "name", "bytes", "ranks", "slowest_rank",
                      "lateness_ns", "transfer_ns", "wall_ns"]  # fmt: skip


def collective_spans(spans: pd.DataFrame) -> pd.DataFrame:
    """One row per collective per rank, with its wait and transfer (empty without
    collectives that carry a rank, a step and a seq)."""
    sel = (spans["category"] == "comm").to_numpy() & spans["rank"].notna().to_numpy()
    sel &= spans["step_id"].notna().to_numpy()
    c = spans[sel]
    if not len(c):
        return pd.DataFrame({k: pd.Series(dtype="int64") for k in PER_RANK_COLUMNS})
    seq = [_seq(a) for a in c["args"]]
    df = pd.DataFrame(
        {
            "step_id": c["step_id"].to_numpy(np.int64),
            "seq": np.array(seq, dtype=np.int64),
            "rank": c["rank"].to_numpy(np.int64),
            "name": c["name"].astype(str).to_numpy(),
            "bytes": c["bytes"].fillna(0).to_numpy(np.int64),
            "start_ns": c["start_ns"].to_numpy(np.int64),
            "dur_ns": c["dur_ns"].to_numpy(np.int64),
        }
    )
    df = df[df["seq"] >= 0]
    df["end_ns"] = df["start_ns"] + df["dur_ns"]
    last = df.groupby(["step_id", "seq"])["start_ns"].transform("max").to_numpy(np.int64)
    df["wait_ns"] = last - df["start_ns"].to_numpy(np.int64)
    df["transfer_ns"] = np.maximum(df["end_ns"].to_numpy(np.int64) - last, 0)
    return df[PER_RANK_COLUMNS].sort_values(["step_id", "seq", "rank"], ignore_index=True)


def _seq(args) -> int:
    if not isinstance(args, str):
        return -1
    try:
        return int(json.loads(args).get("seq", -1))
    except (ValueError, TypeError, AttributeError):
        return -1


def by_collective(per_rank: pd.DataFrame) -> pd.DataFrame:
    """One row per collective: bytes, ranks, the rank that entered last and by how much,
    the wall time from first entry to last exit and its transfer part."""
    if not len(per_rank):
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    g = per_rank.groupby(["step_id", "seq"], sort=True)
    idx = g["start_ns"].idxmax()
    out = pd.DataFrame(
        {
            "name": g["name"].first(),
            "bytes": g["bytes"].max(),
            "ranks": g["rank"].nunique(),
            "slowest_rank": per_rank.loc[idx.to_numpy(), "rank"].to_numpy(),
            "lateness_ns": g["wait_ns"].max(),  # how late the last rank came
            "transfer_ns": g["transfer_ns"].median(),
            "wall_ns": g["end_ns"].max() - g["start_ns"].min(),
        }
    )
    return out.reset_index()


def by_step(per_rank: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per engine step (rank 0's step rows): its wall time, collectives, bytes, and, per
    rank, the time in collectives split into waiting and transfer; comm share = rank 0's
    collective time / step time."""
    cols = ["step_id", "step_ns", "collectives", "bytes", "comm_ns", "wait_ns",
            "transfer_ns", "comm_share"]  # fmt: skip
    if not len(per_rank) or not len(steps):
        return pd.DataFrame(columns=cols)
    r0 = per_rank[per_rank["rank"] == per_rank["rank"].min()]
    g = r0.groupby("step_id")
    agg = pd.DataFrame(
        {
            "collectives": g.size(),
            "bytes": g["bytes"].sum(),
            "comm_ns": g["dur_ns"].sum(),
            "wait_ns": g["wait_ns"].sum(),
            "transfer_ns": g["transfer_ns"].sum(),
        }
    )
    st = steps[["step_id", "start_ns", "end_ns"]].drop_duplicates("step_id")
    st = st.assign(step_ns=(st["end_ns"] - st["start_ns"]).to_numpy(np.int64))
    out = (
        st[["step_id", "step_ns"]]
        .astype({"step_id": "int64"})
        .merge(agg, left_on="step_id", right_index=True, how="inner")
    )
    out["comm_share"] = out["comm_ns"] / out["step_ns"].where(out["step_ns"] > 0)
    return out[cols].reset_index(drop=True)


class CommSummary(NamedTuple):
    ranks: int
    steps: int
    collectives_per_step: float
    bytes_per_step: float
    step_ms: float  # mean step time (rank 0)
    comm_ms_per_step: float  # rank 0's time in collectives per step
    comm_share: float  # of step time
    wait_share: float  # of collective time, all ranks: waiting for the slowest to enter
    transfer_share: float
    all_reduce_us: float  # median collective duration (rank 0)
    all_reduce_transfer_us: float  # median transfer part
    straggler_rank: int  # the rank that enters last most often
    straggler_share: float  # of collectives it entered last
    straggler_lateness_us: float  # median lateness when it did
    rank_wait_ms: dict  # rank → total waiting in collectives
    clock_uncertainty_us: float  # the largest alignment uncertainty of any rank


def summarize(run) -> CommSummary | None:
    """The run's collectives in a few numbers; None without per-rank collectives."""
    per_rank = collective_spans(run.spans)
    if not len(per_rank):
        return None
    steps = by_step(per_rank, run.steps)
    coll = by_collective(per_rank)
    total = float(per_rank["dur_ns"].sum())
    r0 = per_rank[per_rank["rank"] == per_rank["rank"].min()]
    counts = coll["slowest_rank"].value_counts()
    straggler = int(counts.index[0])
    late = coll[coll["slowest_rank"] == straggler]["lateness_ns"]
    waits = per_rank.groupby("rank")["wait_ns"].sum()
    sync = (run.manifest.config or {}).get("parallel", {}).get("clock_sync") or []
    step_ns = float(steps["step_ns"].sum())
    return CommSummary(
        ranks=int(per_rank["rank"].nunique()),
        steps=len(steps),
        collectives_per_step=float(steps["collectives"].mean()),
        bytes_per_step=float(steps["bytes"].mean()),
        step_ms=float(steps["step_ns"].mean()) / 1e6,
        comm_ms_per_step=float(steps["comm_ns"].mean()) / 1e6,
        comm_share=float(steps["comm_ns"].sum()) / step_ns if step_ns else float("nan"),
        wait_share=float(per_rank["wait_ns"].sum()) / total if total else float("nan"),
        transfer_share=float(per_rank["transfer_ns"].sum()) / total if total else float("nan"),
        all_reduce_us=float(r0["dur_ns"].median()) / 1e3,
        all_reduce_transfer_us=float(r0["transfer_ns"].median()) / 1e3,
        straggler_rank=straggler,
        straggler_share=float(counts.iloc[0]) / len(coll),
        straggler_lateness_us=float(late.median()) / 1e3,
        rank_wait_ms={int(k): float(v) / 1e6 for k, v in waits.items()},
        clock_uncertainty_us=max((s.get("uncertainty_ns", 0) for s in sync), default=0) / 1e3,
    )
