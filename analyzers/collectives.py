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
                    "dur_ns", "wait_ns", "transfer_ns", "cpu_ns"]  # fmt: skip


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
    parsed = [_seq_cpu(a) for a in c["args"]]
    seq = [p[0] for p in parsed]
    df = pd.DataFrame(
        {
            "step_id": c["step_id"].to_numpy(np.int64),
            "seq": np.array(seq, dtype=np.int64),
            "rank": c["rank"].to_numpy(np.int64),
            "name": c["name"].astype(str).to_numpy(),
            "bytes": c["bytes"].fillna(0).to_numpy(np.int64),
            "start_ns": c["start_ns"].to_numpy(np.int64),
            "dur_ns": c["dur_ns"].to_numpy(np.int64),
            "cpu_ns": np.array([p[1] for p in parsed], dtype=np.float64),  # NaN: not recorded
        }
    )
    df = df[df["seq"] >= 0]
    df["end_ns"] = df["start_ns"] + df["dur_ns"]
    last = df.groupby(["step_id", "seq"])["start_ns"].transform("max").to_numpy(np.int64)
    df["wait_ns"] = last - df["start_ns"].to_numpy(np.int64)
    df["transfer_ns"] = np.maximum(df["end_ns"].to_numpy(np.int64) - last, 0)
    return df[PER_RANK_COLUMNS].sort_values(["step_id", "seq", "rank"], ignore_index=True)


def _seq_cpu(args) -> tuple[int, float]:
    """(seq, the process's CPU time inside the call) from a comm span's args."""
    if not isinstance(args, str):
        return -1, float("nan")
    try:
        a = json.loads(args)
        cpu = a.get("cpu_time_ns")
        return int(a.get("seq", -1)), float(cpu) if cpu else float("nan")
    except (ValueError, TypeError, AttributeError):
        return -1, float("nan")


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


class RankHost(NamedTuple):
    """One rank's forwards: how long they took and the CPU its process got over them —
    what tells a straggler that shares its cores (less CPU per second than the others)
    from one that had them and still ran longer. Wall time includes the rank's collectives
    (gloo's threads work during them), the same way for every rank."""

    rank: int
    forward_ms: float  # median forward (workers: tp_forward; rank 0: its forward phase)
    cpu_per_s: float  # process CPU seconds per second of forward (rank 0: of step)
    switches_per_forward: float  # involuntary context switches per forward (rank 0: step)


def rank_hosts(run, per_rank: pd.DataFrame) -> dict[int, RankHost]:
    """Per rank, from the workers' `tp_forward` spans (their args carry the process's CPU
    time and preemptions over the forward) and rank 0's forward phases and step rows."""
    sp = run.spans
    out: dict[int, RankHost] = {}
    fwd = sp[(sp["name"] == "tp_forward").to_numpy() & sp["rank"].notna().to_numpy()]
    for rank, f in fwd.groupby("rank"):
        host = np.array([_host_args(a) for a in f["args"]], dtype=float).reshape(-1, 2)
        wall = f["dur_ns"].to_numpy(float)
        out[int(rank)] = RankHost(int(rank), float(np.median(wall)) / 1e6,
                                  _ratio(host[:, 0], wall), _mean(host[:, 1]))  # fmt: skip
    r0 = int(per_rank["rank"].min()) if len(per_rank) else 0
    phases = sp[(sp["name"] == "forward").to_numpy() & (sp["category"] == "phase").to_numpy()]
    st = run.steps.drop_duplicates("step_id")
    if len(phases) and r0 not in out:
        wall = (st["end_ns"] - st["start_ns"]).to_numpy(float)
        nan = np.full(len(st), np.nan)
        cpu = st["cpu_time_ns"].to_numpy("float64", na_value=np.nan) if "cpu_time_ns" in st else nan
        sw = (st["involuntary_switches"].to_numpy("float64", na_value=np.nan)
              if "involuntary_switches" in st else nan)  # fmt: skip
        out[r0] = RankHost(r0, float(phases["dur_ns"].median()) / 1e6, _ratio(cpu, wall),
                           _mean(sw))  # fmt: skip
    return dict(sorted(out.items()))


def _host_args(args) -> tuple[float, float]:
    try:
        a = json.loads(args)
        return float(a["cpu_time_ns"]), float(a.get("involuntary_switches", np.nan))
    except (TypeError, ValueError, KeyError, AttributeError):
        return float("nan"), float("nan")


def _ratio(cpu: np.ndarray, wall: np.ndarray) -> float:
    ok = np.isfinite(cpu) & (wall > 0)
    return float(cpu[ok].sum() / wall[ok].sum()) if ok.any() else float("nan")


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


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
    # Rank 0's time in collectives once every rank was in (what the collectives cost
    # themselves), per step; the rest of comm_ms_per_step is waiting for a later rank.
    own_comm_ms_per_step: float
    # The rank the others wait for most, and the step time that costs: the others' mean
    # waiting less its own (waiting both ways is jitter; one-sided waiting is a straggler).
    waited_for_rank: int
    imbalance_ms_per_step: float
    imbalance_share: float  # of step time
    imbalance_bound_share: float  # what clock misalignment alone could make of it
    hosts: dict  # rank → RankHost


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
    uncertainty_ns = max((s.get("uncertainty_ns", 0) for s in sync), default=0)
    waited_for = int(waits.idxmin())
    others = waits.drop(waited_for)
    imbalance_ns = float(others.mean() - waits[waited_for]) if len(others) else 0.0
    # A clock offset error δ moves every wait by ±δ, one way for one rank and the other way
    # for the other: the one-sided difference can be off by 2δ per collective.
    bound_ns = 2.0 * uncertainty_ns * len(coll)
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
        clock_uncertainty_us=uncertainty_ns / 1e3,
        own_comm_ms_per_step=float((steps["comm_ns"] - steps["wait_ns"]).mean()) / 1e6,
        waited_for_rank=waited_for,
        imbalance_ms_per_step=imbalance_ns / len(steps) / 1e6 if len(steps) else 0.0,
        imbalance_share=imbalance_ns / step_ns if step_ns else float("nan"),
        imbalance_bound_share=bound_ns / step_ns if step_ns else float("nan"),
        hosts=rank_hosts(run, per_rank),
    )
