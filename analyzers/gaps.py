"""The launch ↔ GPU-work correlation join, launch-delay statistics, and GPU idle gaps
classified by what the work after each gap waited for (definitions in docs/timeline.md).

First its launch: when the launch call began after the GPU ran dry, the host was late —
- `sync`: the host was blocked in a synchronisation (a `*Synchronize` call, a blocking
  copy, a `cuda_sync` record) when the GPU ran dry, and launched the next work after it;
- `host_bound`: the launching thread was busy (recorded CPU activity covers at least half
  the time from the gap's start to the launch);
- `no_work`: the launching thread was mostly idle in the trace (waiting for input, a lock,
  another process): no work was offered.
When the work was launched before the GPU ran dry, the evidence of analyzers/gap_evidence.py
decides: `host_wait`, `stream_wait`, `peer_wait`, `graph`, `unexplained`, else
`launch_delay` (launch latency / queueing, not the host's fault). An op that starts before
its launch call is `unexplained` (the clocks disagree); `unlinked`: the work after the gap
has no launch in the trace (no correlation). `waited_on` names the evidence.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import gap_evidence
from .intervals import Coverage, gaps, union
from .spans import GPU_CLASSES, category_mask, cls_mask, resource_codes

LATE_CAUSES = ("sync", "host_bound", "no_work")  # the work waited for its launch
GAP_CLASSES = (*LATE_CAUSES, *gap_evidence.OFFERED_CAUSES, "unlinked")
HOST_BUSY_FRACTION = 0.5
_SYNC_CALL = re.compile(
    r"(?i)synchroni[sz]e|^(?:cuda|hip)Memcpy(?:2D|3D)?$|^cuMemcpy(?:DtoH|HtoD|DtoD)?(?:_v2)?$"
)


def gpu_work(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["on_gpu"].to_numpy() & cls_mask(df, *GPU_CLASSES)]


def launch_join(df: pd.DataFrame) -> pd.DataFrame:
    """Every GPU op with the runtime/driver call that launched it (same rank and
    correlation id; a CUDA-graph launch links all its kernels). Unlinked ops keep NA."""
    ops = gpu_work(df)
    calls = df[cls_mask(df, "runtime") & df["correlation"].notna().to_numpy()]
    # A runtime call and the driver call beneath it may share an id: prefer the runtime.
    calls = calls.assign(_driver=category_mask(calls["category"], ["cuda_driver"]))
    calls = calls.sort_values(["_driver", "start_ns"]).drop_duplicates(
        ["rank_key", "correlation"], keep="first"
    )
    launches = pd.DataFrame(
        {
            "rank_key": calls["rank_key"].to_numpy(),
            "correlation": calls["correlation"].array,
            "launch_name": calls["name"].array,
            # Nullable ints: a left join fills NA, and a float column would round 1.7e18 ns.
            "launch_start_ns": pd.array(calls["start_ns"].to_numpy(np.int64), dtype="Int64"),
            "launch_dur_ns": pd.array(calls["dur_ns"].to_numpy(np.int64), dtype="Int64"),
            "launch_pid": calls["pid"].array,
            "launch_tid": calls["tid"].array,
        }
    )
    joined = ops.reset_index(names="span_index").merge(
        launches, on=["rank_key", "correlation"], how="left", sort=False
    )
    joined["linked"] = joined["launch_start_ns"].notna().to_numpy()
    joined["launch_start_ns"] = joined["launch_start_ns"].astype("Int64")
    joined["launch_dur_ns"] = joined["launch_dur_ns"].astype("Int64")
    joined["queue_ns"] = joined["start_ns"].astype("Int64") - joined["launch_start_ns"]
    return joined


def launch_stats(joined: pd.DataFrame) -> pd.DataFrame:
    """Per launch API: how many ops it launched, the CPU cost of the call and the delay
    from the call's start to the op's start on the GPU (mean, p50, p90, p99, max)."""
    linked = joined[joined["linked"].to_numpy()]
    if not len(linked):
        return pd.DataFrame()
    frame = linked.assign(
        queue=linked["queue_ns"].astype("float64"), call=linked["launch_dur_ns"].astype("float64")
    )
    g = frame.groupby("launch_name", sort=False)
    out = pd.DataFrame(
        {
            "ops": g.size(),
            "call_mean_ns": g["call"].mean(),
            "call_p99_ns": g["call"].quantile(0.99),
            "queue_mean_ns": g["queue"].mean(),
            "queue_p50_ns": g["queue"].quantile(0.5),
            "queue_p90_ns": g["queue"].quantile(0.9),
            "queue_p99_ns": g["queue"].quantile(0.99),
            "queue_max_ns": g["queue"].max(),
        }
    )
    return out.sort_values("ops", ascending=False).reset_index()


def linked_fraction(joined: pd.DataFrame, cls: str | None = "kernel") -> float:
    sel = joined if cls is None else joined[cls_mask(joined, cls)]
    return float(sel["linked"].mean()) if len(sel) else float("nan")


def _sync_coverage(df: pd.DataFrame, rank: int) -> Coverage:
    syncs = gap_evidence.host_syncs(df, rank, _SYNC_CALL)
    return union(syncs["start_ns"].to_numpy(), syncs["end_ns"].to_numpy()).coverage()


def idle_gaps(df: pd.DataFrame, joined: pd.DataFrame) -> pd.DataFrame:
    """Every gap between GPU work on each device (all streams together), classified."""
    columns = ["rank_key", "device", "start_ns", "end_ns", "dur_ns", "next_op", "launch_name",
               "launch_start_ns", "launch_pid", "launch_tid", "cause", "waited_on"]  # fmt: skip
    if not len(joined):
        return pd.DataFrame(columns=columns)
    codes = resource_codes(joined, ["rank_key", "device"])
    s, e = joined["start_ns"].to_numpy(np.int64), joined["end_ns"].to_numpy(np.int64)
    u = union(s, e, codes)
    g_start, g_end, nxt = gaps(u)
    # The op that ends a gap opens the next piece: the first op, in (device, start) order,
    # starting where the piece starts. One searchsorted over a combined key finds them all.
    order = np.lexsort((s, codes))
    base, width = int(s.min()), int(s.max()) - int(s.min()) + 1
    flat = codes[order] * width + (s[order] - base)
    pos = np.searchsorted(flat, u.group[nxt] * width + (u.start[nxt] - base), side="left")
    nxt_ops = joined.iloc[order[pos]]
    out = pd.DataFrame(
        {
            "rank_key": nxt_ops["rank_key"].to_numpy(),
            "device": nxt_ops["device"].to_numpy(),
            "start_ns": g_start,
            "end_ns": g_end,
            "dur_ns": g_end - g_start,
            "next_op": nxt_ops["name"].array,
            # .array keeps Int64 (exact ns; a float would round 1.7e18 to 256 ns)
            "launch_name": nxt_ops["launch_name"].array,
            "launch_start_ns": nxt_ops["launch_start_ns"].array,
            "launch_pid": nxt_ops["launch_pid"].array,
            "launch_tid": nxt_ops["launch_tid"].array,
        }
    )
    evidence = {
        "next_stream": nxt_ops["stream"].array,
        "next_comm": cls_mask(nxt_ops, "comm"),
    }
    out["cause"], out["waited_on"] = _classify(df, out.assign(**evidence))
    return out


def _classify(df: pd.DataFrame, g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    cause = np.full(len(g), "unlinked", dtype=object)
    waited = np.full(len(g), "", dtype=object)
    linked = g["launch_start_ns"].notna().to_numpy()
    launch = g["launch_start_ns"].fillna(0).astype("int64").to_numpy()
    start, op_start = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
    names = g["launch_name"].astype(str).to_numpy(dtype=object)
    skewed = linked & (launch > op_start)  # the op ran before its launch: clocks disagree
    cause[skewed], waited[skewed] = "unexplained", "starts before its launch"
    early = linked & ~skewed & (launch < start)
    idx = np.flatnonzero(early)
    cause[idx], waited[idx] = gap_evidence.offered(df, g.iloc[idx], _SYNC_CALL, HOST_BUSY_FRACTION)
    late = linked & ~skewed & ~early
    if not late.any():
        return cause, waited
    waited[late] = names[late]
    cpu = df[~df["on_gpu"].to_numpy() & cls_mask(df, "runtime", "cpu", "comm")]
    for rank in np.unique(g["rank_key"].to_numpy()[late]):
        in_rank = late & (g["rank_key"].to_numpy() == rank)
        sync = _sync_coverage(df, int(rank)).contains(start[in_rank])
        idx = np.flatnonzero(in_rank)
        cause[idx[sync]] = "sync"
        syncs = gap_evidence.host_syncs(df, int(rank), _SYNC_CALL)
        at = start[idx[sync]]
        found = gap_evidence.sync_name_at(syncs, at, at + 1)
        waited[idx[sync]] = np.where(found == "", waited[idx[sync]], found)
        rest = idx[~sync]
        if not len(rest):
            continue
        # Busy fraction of the launching thread between the gap's start and the launch.
        mine = cpu[cpu["rank_key"].to_numpy() == rank]
        threads = g.iloc[rest][["launch_pid", "launch_tid"]].astype("float64").to_numpy()
        busy = np.zeros(len(rest))
        for pid, tid in {tuple(t) for t in threads}:
            on = (mine["pid"].astype("float64") == pid).to_numpy() & (
                mine["tid"].astype("float64") == tid
            ).to_numpy()
            cov = union(mine["start_ns"].to_numpy()[on], mine["end_ns"].to_numpy()[on]).coverage()
            sel = (threads[:, 0] == pid) & (threads[:, 1] == tid)
            a, b = start[rest[sel]], launch[rest[sel]]
            width = np.maximum(b - a, 1)
            busy[sel] = cov.between(a, np.maximum(b, a + 1)) / width
        cause[rest] = np.where(busy >= HOST_BUSY_FRACTION, "host_bound", "no_work")
    return cause, waited


def gap_summary(g: pd.DataFrame) -> pd.DataFrame:
    """Count, total and percentiles of the idle gaps per cause (and rank)."""
    if not len(g):
        columns = ["rank_key", "cause", "gaps", "total_ns", "mean_ns", "max_ns", "p50_ns", "p99_ns"]
        return pd.DataFrame(columns=columns)
    grouped = g.groupby(["rank_key", "cause"], sort=True)["dur_ns"]
    out = grouped.agg(gaps="size", total_ns="sum", mean_ns="mean", max_ns="max").reset_index()
    out["p50_ns"] = grouped.quantile(0.5).to_numpy()
    out["p99_ns"] = grouped.quantile(0.99).to_numpy()
    return out
