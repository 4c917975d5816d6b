"""Engine steps as the explorer shows them: the table of every step (composition, queue
and KV state, GPU time, host time after it, roofline position) and one step's detail —
its phases, and the kernels and ops recorded in it with their roofline positions.

Spans are indexed by step once (sorted step ids and a permutation), so opening a step
of a million-span run is a binary search, not a scan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .data import RunData

SPAN_COLUMNS = ["name", "category", "start_ns", "dur_ns", "pid", "tid", "device", "stream",
                "step_id", "flops", "bytes"]  # fmt: skip


def steps_frame(data: RunData) -> pd.DataFrame:
    s = data.run.steps
    if not len(s):
        return pd.DataFrame(columns=["key", "step_id"])
    s = s.sort_values("start_ns", kind="stable")
    origin = int(s["start_ns"].min())
    start = s["start_ns"].to_numpy(np.int64)
    end = s["end_ns"].to_numpy(np.int64)
    rank = s["rank"].to_numpy(dtype="float64", na_value=np.nan)
    pf, dec = s["num_prefill_tokens"].to_numpy(), s["num_decode_seqs"].to_numpy()
    kind = np.where((pf > 0) & (dec > 0), "mixed", np.where(pf > 0, "prefill", "decode"))
    kind[(pf == 0) & (dec == 0)] = "empty"
    after = np.full(len(s), np.nan)
    if len(s) > 1:  # host time after the step: to the next step of the same rank
        same = np.r_[rank[1:] == rank[:-1], False] | np.r_[np.isnan(rank[1:]), False]
        nxt = np.r_[start[1:], 0]
        after = np.where(same, (nxt - end) / 1e6, np.nan)
    used = s["kv_blocks_used"].to_numpy(dtype="float64", na_value=np.nan)
    free = s["kv_blocks_free"].to_numpy(dtype="float64", na_value=np.nan)
    ids = s["step_id"].to_numpy()
    out = pd.DataFrame({
        "key": [f"{int(r)}:{i}" if r == r else str(i) for r, i in zip(rank, ids, strict=True)],
        "step_id": ids,
        "rank": rank,
        "start_ms": (start - origin) / 1e6,
        "dur_ms": (end - start) / 1e6,
        "kind": kind,
        "prefill_seqs": s["num_prefill_seqs"].to_numpy(),
        "prefill_tokens": pf,
        "decode_seqs": dec,
        "context_tokens": s["num_context_tokens"].to_numpy(),
        "waiting": s["num_waiting"].to_numpy(dtype="float64", na_value=np.nan),
        "running": s["num_running"].to_numpy(dtype="float64", na_value=np.nan),
        "preempted": s["num_preempted"].to_numpy(dtype="float64", na_value=np.nan),
        "kv_pct": 100 * used / (used + free),
        "gpu_ms": s["gpu_time_ns"].to_numpy(dtype="float64", na_value=np.nan) / 1e6,
        "host_after_ms": after,
    })  # fmt: skip
    roof = data.roofline.steps
    if len(roof):
        r = roof.drop_duplicates("step_id").set_index("step_id")
        out["pct_of_roof"] = r["pct_of_roof"].reindex(ids).to_numpy()
        out["bound"] = r["bound"].reindex(ids).astype(object).fillna("").to_numpy()
    return out


class SpanIndex:
    """The spans of a run grouped by step: `of_step(step_id)` is a slice."""

    def __init__(self, data: RunData) -> None:
        t = data.run.arrow("spans", SPAN_COLUMNS)
        from ..traces.reader import to_frame

        frame = to_frame("spans", t)
        has = frame["step_id"].notna().to_numpy()
        frame = frame[has]
        steps = frame["step_id"].to_numpy(np.int64)
        order = np.argsort(steps, kind="stable")
        self.frame = frame.iloc[order].reset_index(drop=True)
        self.steps = steps[order]

    def of_step(self, step_id: int) -> pd.DataFrame:
        lo = np.searchsorted(self.steps, step_id, side="left")
        hi = np.searchsorted(self.steps, step_id, side="right")
        return self.frame.iloc[lo:hi]


def recorded_work(index: SpanIndex, step_ids) -> dict[int, tuple[int, int]]:
    """Per step: how many ops were recorded in it (kernels, copies, CPU ops, launches;
    not the engine's phases) and the time of those that ran on a GPU (ns)."""
    out = {}
    for sid in step_ids:
        w = index.of_step(int(sid))
        ops = (w["category"].astype(str) != "phase").to_numpy()
        gpu = ops & w["device"].notna().to_numpy()
        out[int(sid)] = (int(ops.sum()), int(w["dur_ns"].to_numpy()[gpu].sum()))
    return out


@dataclass(frozen=True)
class StepDetail:
    step_id: int
    row: dict  # the steps_frame row
    phases: pd.DataFrame  # name, offset_ms (from the step's start), dur_ms
    work: pd.DataFrame  # kernels, copies, ops: name, category, resource, offset_ms, dur_us,
    # flops, bytes, intensity, pct_of_roof, bound
    roofline: dict | None  # the step's own position (analytic model), if any


def step_detail(data: RunData, index: SpanIndex, step_id: int, frame: pd.DataFrame | None = None):
    frame = steps_frame(data) if frame is None else frame
    rows = frame[frame["step_id"] == step_id]
    if not len(rows):
        return None
    row = rows.iloc[0].to_dict()
    s = data.run.steps
    start = int(s.loc[(s["step_id"] == step_id).to_numpy(), "start_ns"].min())
    spans = index.of_step(step_id)
    is_phase = (spans["category"].astype(str) == "phase").to_numpy()
    ph = spans[is_phase].sort_values("start_ns")
    phases = pd.DataFrame({
        "name": ph["name"].astype(str).to_numpy(),
        "offset_ms": (ph["start_ns"].to_numpy(np.int64) - start) / 1e6,
        "dur_ms": ph["dur_ns"].to_numpy(np.int64) / 1e6,
    })  # fmt: skip
    w = spans[~is_phase].sort_values("start_ns")
    work = pd.DataFrame({
        "name": w["name"].astype(str).to_numpy(),
        "category": w["category"].astype(str).to_numpy(),
        "resource": _resource(w),
        "offset_ms": (w["start_ns"].to_numpy(np.int64) - start) / 1e6,
        "dur_us": w["dur_ns"].to_numpy(np.int64) / 1e3,
    })  # fmt: skip
    f = w["flops"].to_numpy(dtype="float64", na_value=np.nan)
    b = w["bytes"].to_numpy(dtype="float64", na_value=np.nan)
    work["flops"], work["bytes"] = f, b
    r = data.roofline
    pos = _position(f, b, w["dur_ns"].to_numpy(np.float64) / 1e9, r)
    work["intensity"], work["pct_of_roof"], work["bound"] = pos
    mine = r.steps[r.steps["step_id"] == step_id] if len(r.steps) else r.steps
    roof = mine.iloc[0].to_dict() if len(mine) else None
    return StepDetail(int(step_id), row, phases, work, roof)


def _resource(w: pd.DataFrame) -> list[str]:
    dev = w["device"].to_numpy(dtype="float64", na_value=np.nan)
    stream = w["stream"].to_numpy(dtype="float64", na_value=np.nan)
    tid = w["tid"].to_numpy(dtype="float64", na_value=np.nan)
    out = []
    for d, s, t in zip(dev, stream, tid, strict=True):
        if d == d:  # not NaN: a GPU queue
            out.append(f"gpu{int(d)}/s{int(s) if s == s else '?'}")
        else:
            out.append(f"tid {int(t)}" if t == t else "")
    return out


def _position(flops, nbytes, seconds, report):
    from ..analyzers.roofline import position

    if not len(flops):
        return np.array([]), np.array([]), np.array([], dtype=object)
    p = position(np.nan_to_num(flops, nan=0.0), np.nan_to_num(nbytes, nan=0.0), seconds,
                 report.ceilings, report.dtype)  # fmt: skip
    known = ~np.isnan(flops) & ~np.isnan(nbytes)
    intensity = np.where(known, p["intensity"], np.nan)
    pct = np.where(known, p["pct_of_roof"], np.nan)
    bound = np.where(known, p["bound"].astype(object), "")
    return intensity, pct, bound
