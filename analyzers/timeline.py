"""Resource timelines: analysis windows, the step-time breakdown, per-resource busy/idle
time, and compute/copy/comm overlap. Pure pandas/numpy over a spans frame prepared by
`spans.prepare` (see docs/timeline.md for the definitions).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..traces.vllm_names import VLLM_STEP
from .intervals import Union, overlap_ns, union
from .spans import (
    CLASS_CODE,
    CLASSES,
    GPU_CLASSES,
    NULL_ID,
    category_mask,
    cls_mask,
    group_codes,
    id_array,
    pattern_mask,
)

_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
# vLLM's worker marks each engine step (`execute_context_1(64)_generation_3(3)`: requests in
# prefill (their tokens), requests decoding (theirs); with detailed_trace_annotation
# `execute_67_context_1(sq64…)_generation_3(…)`); a step spans its model execution only,
# so these windows do not tile the trace: the time between them is the engine loop's own
# (scheduling, output processing) or no work, and is reported apart (`outside_windows`).
WINDOW_COLUMNS = ["rank_key", "step", "name", "start_ns", "end_ns", "source"]
OUTSIDE_COLUMNS = ["rank_key", "extent_ns", "inside_ns", "outside_ns", "host_outside_ns"]


def windows(df: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The analysis windows, per rank: the run's engine steps when it has them, else
    `ProfilerStep#N` annotations (each lasting until the next one starts; the last until
    the GPU work it launched ends), else vLLM's step annotations (each its own extent),
    else the whole trace as one window."""
    if steps is not None and len(steps):
        w = pd.DataFrame(
            {
                "rank_key": steps["rank"].fillna(-1).astype("int64").to_numpy(),
                "step": steps["step_id"].astype("Int64").to_numpy(),
                "name": "step " + steps["step_id"].astype(str),
                "start_ns": steps["start_ns"].to_numpy(np.int64),
                "end_ns": steps["end_ns"].to_numpy(np.int64),
                "source": "steps",
            }
        )
        return w.sort_values(["rank_key", "start_ns"], ignore_index=True)
    parts = []
    for rank, sub in df.groupby("rank_key", sort=True):
        parts.append(_rank_windows(int(rank), sub))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in WINDOW_COLUMNS})
    return pd.concat(parts, ignore_index=True)


def _rank_windows(rank: int, sub: pd.DataFrame) -> pd.DataFrame:
    is_step = category_mask(sub["category"], ["annotation"]) & ~sub["on_gpu"].to_numpy()
    is_step &= pattern_mask(sub["name"], _PROFILER_STEP)
    marks = sub[is_step].sort_values("start_ns").drop_duplicates("start_ns")
    if len(marks) == 0:
        vllm = _vllm_windows(rank, sub)
        if vllm is not None:
            return vllm
        return pd.DataFrame(
            {
                "rank_key": [rank],
                "step": pd.array([pd.NA], dtype="Int64"),
                "name": ["trace"],
                "start_ns": [int(sub["start_ns"].min())],
                "end_ns": [int(sub["end_ns"].max())],
                "source": ["trace"],
            }
        )
    names = [str(n) for n in marks["name"]]  # one per step: few
    start = marks["start_ns"].to_numpy(np.int64)
    end = np.r_[start[1:], marks["end_ns"].to_numpy(np.int64)[-1]]
    end[-1] = max(end[-1], _launched_work_end(sub, start[-1], end[-1]))
    return pd.DataFrame(
        {
            "rank_key": rank,
            "step": pd.array([int(n.split("#")[1]) for n in names], dtype="Int64"),
            "name": names,
            "start_ns": start,
            "end_ns": end,
            "source": "ProfilerStep",
        }
    ).reset_index(drop=True)


def _vllm_windows(rank: int, sub: pd.DataFrame) -> pd.DataFrame | None:
    """vLLM's step annotations as windows of their own extent, numbered in time order;
    None when the rank has none."""
    is_step = category_mask(sub["category"], ["annotation"]) & ~sub["on_gpu"].to_numpy()
    is_step &= pattern_mask(sub["name"], VLLM_STEP)
    marks = sub[is_step].sort_values("start_ns").drop_duplicates("start_ns")
    if not len(marks):
        return None
    start = marks["start_ns"].to_numpy(np.int64)
    end = marks["end_ns"].to_numpy(np.int64)
    end = np.array([max(e, _launched_work_end(sub, s, e)) for s, e in zip(start, end, strict=True)])
    return pd.DataFrame(
        {
            "rank_key": rank,
            "step": pd.array(np.arange(len(marks)), dtype="Int64"),
            "name": [str(n) for n in marks["name"]],
            "start_ns": start,
            "end_ns": end,
            "source": "vllm",
        }
    )


def outside_windows(df: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """Per rank: the traced extent, the time inside its windows and the time outside them
    (between vLLM's steps: the engine loop's host work, or nothing to do), with the share
    of that outside time the host was busy (any CPU span on the rank)."""
    rows = []
    for rank, w in wins.groupby("rank_key", sort=True):
        sub = df[df["rank_key"].to_numpy() == rank]
        if not len(sub):
            continue
        lo, hi = int(sub["start_ns"].min()), int(sub["end_ns"].max())
        inside = union(w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64))
        in_ns = int(inside.coverage().between(np.array([lo]), np.array([hi]))[0])
        cpu = ~sub["on_gpu"].to_numpy()
        host = union(sub["start_ns"].to_numpy(np.int64)[cpu], sub["end_ns"].to_numpy(np.int64)[cpu])
        host_all = int(host.coverage().between(np.array([lo]), np.array([hi]))[0])
        host_in = int(overlap_ns(host, inside, np.array([lo]), np.array([hi]))[0])
        rows.append((int(rank), hi - lo, in_ns, hi - lo - in_ns, host_all - host_in))
    return pd.DataFrame(rows, columns=OUTSIDE_COLUMNS)


def _launched_work_end(sub: pd.DataFrame, lo: int, hi: int) -> int:
    """End of the GPU work whose launch call lies in [lo, hi]."""
    launch = cls_mask(sub, "runtime") & sub["correlation"].notna().to_numpy()
    starts = sub["start_ns"].to_numpy(np.int64)
    launch &= (starts >= lo) & (starts <= hi)
    ids = sub.loc[launch, "correlation"].to_numpy()
    gpu = sub["on_gpu"].to_numpy() & cls_mask(sub, *GPU_CLASSES)
    work = sub.loc[gpu & sub["correlation"].isin(ids).to_numpy(), "end_ns"]
    return int(work.max()) if len(work) else hi


def _class_unions(sub: pd.DataFrame) -> dict[str, Union]:
    cls = sub["cls"].to_numpy()
    s, e = sub["start_ns"].to_numpy(np.int64), sub["end_ns"].to_numpy(np.int64)
    return {c: union(s[cls == CLASS_CODE[c]], e[cls == CLASS_CODE[c]]) for c in CLASSES}


def breakdown(df: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """Per window: time in each class, each instant counted once for the first active
    class in the order kernel > memcpy > memset > comm > runtime > cpu; the rest is idle.
    The parts sum exactly to the window's wall time."""
    out = []
    for rank, w in wins.groupby("rank_key", sort=True):
        lo, hi = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
        unions = _class_unions(df[df["rank_key"].to_numpy() == rank])
        row = w[["rank_key", "step", "name", "start_ns", "end_ns"]].copy()
        row["wall_ns"] = hi - lo
        acc = union([], [])
        covered = np.zeros(len(w), np.int64)
        for c in CLASSES:
            u = unions[c]
            acc = union(np.r_[acc.start, u.start], np.r_[acc.end, u.end])
            now = acc.coverage().between(lo, hi)
            row[f"{c}_ns"] = now - covered
            covered = now
        row["idle_ns"] = row["wall_ns"].to_numpy() - covered
        out.append(row)
    return _concat(out)


def resources(df: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """Busy and idle time of every resource over its rank's analysis span (first window
    start to last window end): each CPU thread and GPU stream, and per GPU the device as a
    whole and its compute, copy and comm engines."""
    span = wins.groupby("rank_key").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    on_gpu = df["on_gpu"].to_numpy()
    gpu_work = on_gpu & cls_mask(df, *GPU_CLASSES)
    selections = [
        ("cpu_thread", ~on_gpu & cls_mask(df, "runtime", "cpu", "comm"), ["pid", "tid"]),
        ("gpu_stream", gpu_work, ["device", "stream"]),
        ("gpu", gpu_work, ["device"]),
        ("gpu_compute", on_gpu & cls_mask(df, "kernel"), ["device"]),
        ("gpu_copy", on_gpu & cls_mask(df, "memcpy", "memset"), ["device"]),
        ("gpu_comm", on_gpu & cls_mask(df, "comm"), ["device"]),
    ]
    # Plain int64 arrays (absent ids as NULL_ID), converted once: six selections take
    # rows from them without building a nullable sub-frame each.
    rank = df["rank_key"].to_numpy(np.int64)
    ids = {k: id_array(df[k]) for k in ("pid", "tid", "device", "stream")}
    start, end = df["start_ns"].to_numpy(np.int64), df["end_ns"].to_numpy(np.int64)
    in_span = np.isin(rank, span.index.to_numpy())
    out = []
    for kind, mask, keys in selections:
        rows = np.flatnonzero(mask & in_span)
        if not len(rows):
            continue
        columns = [rank[rows], *(ids[k][rows] for k in keys)]
        codes, first = group_codes(columns)
        labels = [c[first] for c in columns]
        u = union(start[rows], end[rows], codes)
        piece_rank = labels[0][u.group]
        lo = span["lo"].reindex(piece_rank).to_numpy(np.int64)
        hi = span["hi"].reindex(piece_rank).to_numpy(np.int64)
        busy_piece = np.clip(np.minimum(u.end, hi) - np.maximum(u.start, lo), 0, None)
        busy = np.bincount(u.group, weights=busy_piece, minlength=len(first))
        window = (span["hi"] - span["lo"]).reindex(labels[0]).to_numpy(np.int64)
        frame = pd.DataFrame(
            {
                "rank_key": labels[0],
                "kind": kind,
                "resource": _resource_names(kind, labels[1:]),
                "busy_ns": busy.astype(np.int64),
                "window_ns": window,
                "spans": np.bincount(codes, minlength=len(first)),
            }
        )
        frame["idle_ns"] = frame["window_ns"] - frame["busy_ns"]
        frame["busy_pct"] = (
            100.0 * frame["busy_ns"] / frame["window_ns"].where(frame["window_ns"] > 0)
        )
        out.append(frame)
    return _concat(out)


def _resource_names(kind: str, ids: list[np.ndarray]) -> list[str]:
    cols = [["<NA>" if v == NULL_ID else str(v) for v in c.tolist()] for c in ids]
    if kind == "cpu_thread":
        return [f"pid {p} tid {t}" for p, t in zip(*cols, strict=True)]
    if kind == "gpu_stream":
        return [f"gpu {d} stream {s}" for d, s in zip(*cols, strict=True)]
    return [f"gpu {d}" for d in cols[0]]


def overlap(df: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """Per window: GPU compute, copy and comm time, their overlaps with compute and the
    exposed (not overlapped by compute) copy and comm time."""
    out = []
    on_gpu = df["on_gpu"].to_numpy()
    kernel, comm_m = cls_mask(df, "kernel"), cls_mask(df, "comm")
    copy_m = cls_mask(df, "memcpy", "memset")
    s, e = df["start_ns"].to_numpy(np.int64), df["end_ns"].to_numpy(np.int64)
    ranks = df["rank_key"].to_numpy()
    for rank, w in wins.groupby("rank_key", sort=True):
        lo, hi = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
        mine = on_gpu & (ranks == rank)
        compute = union(s[mine & kernel], e[mine & kernel])
        copy_mask = mine & copy_m
        copy = union(s[copy_mask], e[copy_mask])
        comm = union(s[mine & comm_m], e[mine & comm_m])
        row = w[["rank_key", "step", "name"]].copy()
        row["compute_ns"] = compute.coverage().between(lo, hi)
        row["copy_ns"] = copy.coverage().between(lo, hi)
        row["comm_ns"] = comm.coverage().between(lo, hi)
        row["compute_copy_overlap_ns"] = overlap_ns(compute, copy, lo, hi)
        row["compute_comm_overlap_ns"] = overlap_ns(compute, comm, lo, hi)
        row["exposed_copy_ns"] = row["copy_ns"] - row["compute_copy_overlap_ns"]
        row["exposed_comm_ns"] = row["comm_ns"] - row["compute_comm_overlap_ns"]
        out.append(row)
    return _concat(out)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
