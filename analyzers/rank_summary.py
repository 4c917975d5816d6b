"""Per-rank summaries of a trace and the cross-rank analysis done on them alone.

A many-rank import (traces/importers/ray_import.py) computes each rank's summary where
the rank was imported, and the driver compares ranks from the summaries, never from the
raw spans. The summary of one rank is small (a row per step window, per resource, per
collective), and summaries of ranks computed apart equal those of the merged run
(`summarize` over a multi-rank frame is per rank throughout).

A rank's summary:
- `breakdown`: timeline.breakdown per window (ProfilerStep#N, else the whole trace);
- `resources`: timeline.resources (busy / idle per CPU thread, GPU stream and GPU);
- `collectives`: the rank's collectives in the order it ran them, numbered per name
  (`seq`): GPU communication kernels (NCCL/RCCL), or where a rank has none (gloo, CPU
  traces) its CPU collective calls (`nccl:*`, `gloo:*`, `c10d:*`).

Across ranks (`cross_rank`), the definitions of analyzers/collectives.py (which matches
collectives by `(step_id, seq)` in perfdiag's own TP runs): the n-th collective of one
name on every rank is one collective; it cannot finish before its last rank enters;
a rank's wait = last entry − its entry; the rank entering last is the one waited for.
Stragglers per step: the rank whose window of a step is longest, and by how much it
exceeds the median rank's. Idle per rank: the breakdown's idle time (no class active)
and its GPUs' idle time over the rank's analysis span. Clock skew between files is
not corrected: waits shorter than the ranks' clock disagreement are noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import timeline
from .collectives import by_collective
from .spans import CLASSES, cls_mask

COLLECTIVE_COLUMNS = ["rank", "where", "name", "seq", "start_ns", "dur_ns"]
PER_RANK_COLUMNS = ["rank", "windows", "wall_ns", "busy_ns", "idle_ns", "idle_share",
                    "step_median_ns", "gpu_busy_ns", "gpu_idle_ns", "collectives", "wait_ns",
                    "slowest_steps", "last_in"]  # fmt: skip
STRAGGLER_COLUMNS = ["step", "ranks", "slowest_rank", "wall_ns", "median_ns", "excess_ns"]


@dataclass
class RankSummary:
    """One or more ranks' summary frames (rank_key -1: a span without a rank)."""

    breakdown: pd.DataFrame
    resources: pd.DataFrame
    collectives: pd.DataFrame

    @staticmethod
    def concat(parts: list[RankSummary]) -> RankSummary:
        def cat(name: str) -> pd.DataFrame:
            frames = [getattr(p, name) for p in parts if len(getattr(p, name))]
            return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

        return RankSummary(cat("breakdown"), cat("resources"), cat("collectives"))

    def to_dict(self) -> dict:
        return {k: _records(getattr(self, k)) for k in ("breakdown", "resources", "collectives")}


@dataclass
class CrossRank:
    per_rank: pd.DataFrame  # PER_RANK_COLUMNS
    stragglers: pd.DataFrame  # STRAGGLER_COLUMNS: one row per step seen on ≥ 2 ranks
    collectives: pd.DataFrame  # collectives.COLLECTIVE_COLUMNS (step_id: -1, seq per name)
    imbalance: float  # (max − min) / max of the ranks' busy time (facts rank_imbalance)
    straggler_rank: int | None  # the rank slowest in the most steps (ties: lowest rank)
    waited_for_rank: int | None  # the rank that entered most collectives last

    def to_dict(self) -> dict:
        return {
            "per_rank": _records(self.per_rank),
            "stragglers": _records(self.stragglers),
            "collectives": _records(self.collectives),
            "imbalance": None if self.imbalance != self.imbalance else self.imbalance,
            "straggler_rank": self.straggler_rank,
            "waited_for_rank": self.waited_for_rank,
        }


def summarize(df: pd.DataFrame, steps: pd.DataFrame | None = None) -> RankSummary:
    """The summary of every rank in a prepared spans frame (analyzers.spans.prepare)."""
    wins = timeline.windows(df, steps)
    return RankSummary(
        breakdown=timeline.breakdown(df, wins) if len(df) else pd.DataFrame(),
        resources=timeline.resources(df, wins) if len(df) else pd.DataFrame(),
        collectives=collective_calls(df),
    )


def collective_calls(df: pd.DataFrame) -> pd.DataFrame:
    """Each rank's collectives in start order, numbered per (where, name)."""
    comm = cls_mask(df, "comm")
    on_gpu = df["on_gpu"].to_numpy()
    ranks = df["rank_key"].to_numpy()
    gpu_ranks = np.unique(ranks[comm & on_gpu])
    use = comm & (on_gpu | ~np.isin(ranks, gpu_ranks))  # CPU calls only where no GPU ones
    if len(df):
        use &= on_gpu | df["name"].astype(str).str.contains(":", regex=False).to_numpy()
    c = df[use]
    out = pd.DataFrame(
        {
            "rank": c["rank_key"].to_numpy(np.int64),
            "where": np.where(c["on_gpu"].to_numpy(), "gpu", "cpu"),
            "name": c["name"].astype(str).to_numpy(),
            "start_ns": c["start_ns"].to_numpy(np.int64),
            "dur_ns": c["dur_ns"].to_numpy(np.int64),
        }
    )
    out = out.sort_values(["rank", "where", "name", "start_ns"], kind="stable", ignore_index=True)
    out["seq"] = out.groupby(["rank", "where", "name"]).cumcount().astype(np.int64)
    return out[COLLECTIVE_COLUMNS]


def cross_rank(summary: RankSummary) -> CrossRank:
    """Stragglers, collective waits and idle per rank, from the ranks' summaries."""
    b, r, c = summary.breakdown, summary.resources, summary.collectives
    per_coll = _collective_rows(c)
    coll = by_collective(per_coll)
    if len(coll):
        coll = coll.drop(columns="step_id")
    strag = _stragglers(b)
    ranks = sorted(set(b["rank_key"].tolist()) if len(b) else set())
    rows = []
    for rank in ranks:
        mine = b[b["rank_key"].to_numpy() == rank]
        wall, idle = int(mine["wall_ns"].sum()), int(mine["idle_ns"].sum())
        gpu = (
            r[(r["rank_key"].to_numpy() == rank) & (r["kind"] == "gpu").to_numpy()] if len(r) else r
        )
        waits = per_coll[per_coll["rank"].to_numpy() == rank] if len(per_coll) else per_coll
        rows.append(
            (
                rank,
                len(mine),
                wall,
                wall - idle,
                idle,
                idle / wall if wall else float("nan"),
                int(np.median(mine["wall_ns"].to_numpy())) if len(mine) else 0,
                int(gpu["busy_ns"].sum()) if len(gpu) else 0,
                int(gpu["idle_ns"].sum()) if len(gpu) else 0,
                len(waits),
                int(waits["wait_ns"].sum()) if len(waits) else 0,
                int((strag["slowest_rank"] == rank).sum()) if len(strag) else 0,
                int((coll["slowest_rank"] == rank).sum()) if len(coll) else 0,
            )
        )
    per_rank = pd.DataFrame(rows, columns=PER_RANK_COLUMNS)
    busy = per_rank["busy_ns"]
    imbalance = (
        float((busy.max() - busy.min()) / busy.max())
        if len(per_rank) > 1 and busy.max() > 0
        else float("nan")
    )
    return CrossRank(
        per_rank=per_rank,
        stragglers=strag,
        collectives=coll,
        imbalance=imbalance,
        straggler_rank=_most(per_rank, "slowest_steps"),
        waited_for_rank=_most(per_rank, "last_in"),
    )


def _collective_rows(c: pd.DataFrame) -> pd.DataFrame:
    """collectives.PER_RANK_COLUMNS rows (step_id -1, seq per where and name), with each
    rank's wait (last entry − its entry) and transfer (its end − last entry)."""
    if not len(c):
        return pd.DataFrame(columns=["step_id", "seq", "rank", "name", "bytes", "start_ns",
                                     "end_ns", "dur_ns", "wait_ns", "transfer_ns"])  # fmt: skip
    df = c.copy()
    df["step_id"] = -1
    df["name"] = df["where"] + " " + df["name"]
    df["bytes"] = 0
    df["end_ns"] = df["start_ns"] + df["dur_ns"]
    # One collective: the same seq of the same name on every rank; grouped by name too.
    key = df["name"] + "#" + df["seq"].astype(str)
    df["seq"] = pd.factorize(key)[0].astype(np.int64)
    last = df.groupby("seq")["start_ns"].transform("max").to_numpy(np.int64)
    df["wait_ns"] = last - df["start_ns"].to_numpy(np.int64)
    df["transfer_ns"] = np.maximum(df["end_ns"].to_numpy(np.int64) - last, 0)
    df["name"] = df["name"].astype(str)
    return df.sort_values(["seq", "rank"], ignore_index=True)


def _stragglers(b: pd.DataFrame) -> pd.DataFrame:
    if not len(b) or "step" not in b or not b["step"].notna().any():
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    s = b[b["step"].notna().to_numpy()]
    s = s.assign(step=s["step"].astype("int64"))
    g = s.groupby("step")
    idx = g["wall_ns"].idxmax()  # first max: the lowest rank among equals
    out = pd.DataFrame(
        {
            "ranks": g["rank_key"].nunique(),
            "slowest_rank": s.loc[idx.to_numpy(), "rank_key"].to_numpy(np.int64),
            "wall_ns": g["wall_ns"].max().astype(np.int64),
            "median_ns": g["wall_ns"].median().astype(np.int64),
        }
    ).reset_index()
    out = out[out["ranks"] >= 2]
    out["excess_ns"] = out["wall_ns"] - out["median_ns"]
    return out[STRAGGLER_COLUMNS].reset_index(drop=True)


def _most(per_rank: pd.DataFrame, column: str) -> int | None:
    if not len(per_rank) or per_rank[column].max() <= 0:
        return None
    return int(per_rank.loc[per_rank[column].idxmax(), "rank"])


def _records(frame: pd.DataFrame) -> list[dict]:
    import json

    return json.loads(frame.to_json(orient="records")) if len(frame) else []


CLASS_COLUMNS = [f"{c}_ns" for c in CLASSES]


def summarize_part(part_dir, offset_ns: int = 0) -> RankSummary:
    """The summary of one imported run part, its times moved by `offset_ns` onto the
    merged run's time base (run in the Ray task that imported the part)."""
    from ..traces.reader import load_run
    from .spans import timeline_spans

    run = load_run(part_dir)
    df = timeline_spans(run)
    if offset_ns:
        df["start_ns"] = df["start_ns"].to_numpy(np.int64) + offset_ns
        df["end_ns"] = df["end_ns"].to_numpy(np.int64) + offset_ns
    return summarize(df, run.steps)
