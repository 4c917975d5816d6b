"""The critical path through a trace's steps: the chain of CPU work, launches, GPU work,
gaps and synchronisations that the trace's end waited on, found by walking back from
the last event along each node's binding edge (critical_path_graph.py has the model).

The path tiles the analysed time exactly, so its parts add up to the wall time: per
kind (host work, CUDA API calls, launch latency, kernels, copies, collectives,
kernel-to-kernel gaps, synchronisation), per step (the path cut at step boundaries) and
per op. For the ops that weigh most on it, a replay of the graph with that op halved
(or, for a synchronisation, removed) says what shortening it would save: less than its
time on the path when another chain takes over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import critical_path_graph as cg
from .intervals import union
from .spans import CLASSES, GPU_CLASSES, cls_mask

# What each part of the path is, in the order tables show them.
KINDS = ("cpu", "cuda_api", "host_gap", "thread_wait", "launch", "kernel", "memcpy",
         "memset", "comm", "gpu_gap", "stream_wait", "sync", "start")  # fmt: skip
# HTA's attribution (cpu_bound, gpu_compute, launch overhead, kernel-kernel overhead),
# with copies, communication and synchronisation kept apart.
BOUND_OF = {"cpu": "host", "cuda_api": "host", "host_gap": "host", "thread_wait": "host",
            "launch": "launch overhead", "kernel": "gpu compute", "memcpy": "gpu copy",
            "memset": "gpu copy", "comm": "communication", "gpu_gap": "kernel-to-kernel",
            "stream_wait": "kernel-to-kernel", "sync": "synchronisation",
            "start": "start"}  # fmt: skip
WHAT_IFS = 8  # the heaviest ops on the path that get a replay
GONE = -(2**62)  # an edge weight that takes the edge out of a replay


@dataclass
class CriticalPath:
    segments: pd.DataFrame  # rank_key, start_ns, end_ns, dur_ns, kind, name, resource
    by_kind: pd.DataFrame  # rank_key, kind, bound, path_ns, share
    windows: pd.DataFrame  # rank_key, step, name, wall_ns, then one <kind>_ns per kind
    items: pd.DataFrame  # rank_key, kind, name, path_ns, share, pieces, what_if, saved_ns
    ranks: pd.DataFrame  # rank_key, start_ns, end_ns, path_ns, windows, nodes

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"by_kind": self.by_kind, "windows": self.windows, "items": self.items,
                "ranks": self.ranks}  # fmt: skip

    def bound(self, rank=None) -> pd.Series:
        """Path share per bound class (host, gpu compute, launch overhead, …)."""
        k = self.by_kind if rank is None else self.by_kind[self.by_kind["rank_key"] == rank]
        return k.groupby("bound", sort=False)["path_ns"].sum().sort_values(ascending=False)


def critical_path(df: pd.DataFrame, wins: pd.DataFrame, what_ifs: int = WHAT_IFS) -> CriticalPath:
    """The critical path of every rank over its analysis windows (`timeline.windows`),
    from a spans frame prepared by `spans.prepare`."""
    parts = {"segments": [], "items": [], "ranks": [], "windows": []}
    keys = df["rank_key"].to_numpy()
    for rank, w in wins.groupby("rank_key", sort=True):
        mine = keys == rank
        # One rank (most traces): the frame itself, not a copy (~28 MB at 272k spans).
        sub = df if mine.all() else df[mine]
        w = _traced(w, sub)
        if not len(w):
            continue
        lo, hi = int(w["start_ns"].min()), int(w["end_ns"].max())
        in_range = (sub["end_ns"].to_numpy() > lo) & (sub["start_ns"].to_numpy() < hi)
        if not in_range.any():
            continue
        g = cg.build(sub)
        del sub  # a rank's copy is not needed past its graph
        if not g.n_activities:
            continue
        segs, sink = _walk(g, lo, hi)
        if not len(segs):
            continue
        segs.insert(0, "rank_key", int(rank))
        parts["segments"].append(segs)
        parts["windows"].append(w)
        items = _items(segs)
        parts["items"].append(_what_ifs(g, items, sink, len(w), what_ifs))
        parts["ranks"].append(
            {"rank_key": int(rank), "start_ns": lo, "end_ns": hi,
             "path_ns": int(segs["dur_ns"].sum()), "windows": len(w), "nodes": len(g.time)}
        )  # fmt: skip
    segments = _concat(parts["segments"], ["rank_key", "start_ns", "end_ns", "dur_ns", "kind",
                                           "name", "resource"])  # fmt: skip
    return CriticalPath(
        segments=segments,
        by_kind=_by_kind(segments),
        windows=_windows(segments, _concat(parts["windows"], list(wins.columns))),
        items=_concat(parts["items"], ["rank_key", "kind", "name", "path_ns", "share", "pieces",
                                       "what_if", "saved_ns", "saved_per_window_ns"]),
        ranks=pd.DataFrame(parts["ranks"]),
    )  # fmt: skip


def run_critical_path(run, what_ifs: int = WHAT_IFS) -> CriticalPath:
    """The critical path of a run (recorded or imported) over its analysis windows."""
    from .spans import timeline_spans
    from .timeline import windows

    df = timeline_spans(run)
    return critical_path(df, windows(df, run.steps), what_ifs)


def _traced(w: pd.DataFrame, sub: pd.DataFrame) -> pd.DataFrame:
    """The windows the GPU worked in, when the rank has GPU work: a serving run's engine
    steps cover the whole run, its GPU spans only the profiled steps."""
    on_gpu = sub["on_gpu"].to_numpy() & cls_mask(sub, *GPU_CLASSES)
    if not on_gpu.any():
        return w
    lo, hi = (
        int(sub["start_ns"].to_numpy()[on_gpu].min()),
        int(sub["end_ns"].to_numpy()[on_gpu].max()),
    )
    keep = (w["end_ns"].to_numpy() > lo) & (w["start_ns"].to_numpy() < hi)
    return w[keep]


def _walk(g: cg.Graph, lo: int, hi: int) -> tuple[pd.DataFrame, int]:
    """Back from the last end at or before `hi` along binding edges, to `lo`."""
    ends = g.time[1 : g.source : 2]
    ok = ends <= hi
    if not ok.any():
        return pd.DataFrame(), -1
    sink = 2 * int(np.flatnonzero(ok)[np.argmax(ends[ok])]) + 1
    node, col = _back_from(g, sink, lo)
    if not len(node):
        return pd.DataFrame(), sink
    pred = g.preds[node, col]
    start = np.maximum(g.time[pred], lo)
    end = np.minimum(g.time[node], hi)
    kind = g.kinds[node, col]
    act, pred_act = node // 2, np.minimum(pred // 2, g.n_activities - 1)
    names, resource = _describe(g, kind, act, pred_act)
    f = pd.DataFrame(
        {"start_ns": start, "end_ns": end, "dur_ns": end - start, "kind": names[0],
         "name": names[1], "resource": resource}
    )  # fmt: skip
    head = int(start[0] - lo) if len(start) else 0
    if head > 0:  # the window opens before the path's first event (an annotation's start)
        f.loc[-1] = [lo, int(start[0]), head, "start", "before the first event", ""]
        f = f.sort_index()
    tail = int(hi - g.time[sink])
    if tail > 0:  # the window outlasts its last event (a step annotation still open)
        f.loc[len(f)] = [int(g.time[sink]), hi, tail, "host_gap", "after the last event", ""]
    return f[f["dur_ns"].to_numpy() > 0].reset_index(drop=True), sink


def _back_from(g: cg.Graph, sink: int, lo: int) -> tuple[np.ndarray, np.ndarray]:
    """The path's nodes and their binding edge columns, first to last: from `sink` back
    along binding edges while a node is later than `lo`. Most nodes wait on the node just
    before them (a chain's own edge): such runs are taken as ranges, and Python steps only
    from one cross edge to the next (~4 % of a training trace's path)."""
    idx = np.arange(len(g.time), dtype=g.preds.dtype)  # int32 where ids fit: ~11 MB less
    steps_back = (g.binding == 0) & (g.preds[:, 0] == idx - 1)
    run_start = np.where(steps_back, -1, idx)
    np.maximum.accumulate(run_start, out=run_start)  # per node, the last node that jumps
    del idx, steps_back
    nodes, jumps, taken = [], [], 0
    n = sink
    while n != g.source:
        m = int(run_start[n])  # n, n-1, …, m+1 each wait on the node before; m jumps
        late = g.time[m : n + 1] > lo
        if not late.all():  # the path reaches `lo` inside this run
            first = m + int(np.flatnonzero(~late)[-1]) + 1
            nodes.append(np.arange(n, first - 1, -1))
            break
        nodes.append(np.arange(n, m - 1, -1))
        taken += n - m + 1
        b = int(g.binding[m])
        if b < 0:
            nodes[-1] = nodes[-1][:-1]  # m waited on nothing: the path ends after it
            break
        jumps.append((taken - 1, b))
        n = int(g.preds[m, b])
    node = np.concatenate(nodes) if nodes else np.zeros(0, np.int64)
    col = np.zeros(len(node), np.int64)
    if jumps:
        at, b = np.asarray(jumps).T
        col[at] = b
    return node[::-1].copy(), col[::-1].copy()


def _describe(g: cg.Graph, kind, act, pred_act):
    """Per path segment: its kind's name, what it is named by, and where it ran."""
    gpu_kind = np.asarray((*CLASSES, "none"), dtype=object)[np.minimum(g.cls[act], len(CLASSES))]
    label = np.asarray(cg.KIND_NAMES, dtype=object)[kind]
    label = np.where(kind == cg.DUR_GPU, gpu_kind, label)
    name = g.name[act].copy()
    # A launch is named by its call, a wait by what it waited for, a gap by its place.
    by_pred = np.isin(kind, (cg.LAUNCH, cg.THREAD_WAIT, cg.STREAM_WAIT))
    name[by_pred] = g.name[pred_act[by_pred]]
    waits = np.isin(kind, (cg.THREAD_WAIT, cg.STREAM_WAIT))
    name[waits] = "after " + g.resource[pred_act[waits]] + ": " + g.name[pred_act[waits]]
    gaps = np.isin(kind, (cg.HOST_GAP, cg.GPU_GAP))
    name[gaps] = "gaps on " + g.resource[act[gaps]]
    name[kind == cg.START] = "trace start"
    return (label, name), g.resource[act]


def _items(segs: pd.DataFrame) -> pd.DataFrame:
    total = segs["dur_ns"].sum()
    it = segs.groupby(["kind", "name"], sort=False, observed=True)["dur_ns"].agg(
        path_ns="sum", pieces="size"
    )
    it = it.reset_index().sort_values("path_ns", ascending=False, ignore_index=True)
    it["share"] = it["path_ns"] / total if total else np.nan
    return it


def _what_ifs(g: cg.Graph, items: pd.DataFrame, sink: int, windows: int, top: int):
    """Replay the graph with each of the heaviest items halved (a sync removed)."""
    items = items.assign(what_if="", saved_ns=pd.array([pd.NA] * len(items), dtype="Int64"))
    # The range ends with its last event, whichever chain it is on: a replay is judged
    # by its new last event (removing a sync does not make the GPU's work end sooner).
    in_range = g.time <= g.time[sink]
    base = int(g.time[sink])
    act_kind = _activity_kinds(g)
    done = 0
    for i, row in items.iterrows():
        if done >= top:
            break
        edit = _scaled(g, act_kind, row["kind"], row["name"])
        if edit is None:
            continue
        what = "removed" if row["kind"] == "sync" else "halved"
        items.at[i, "what_if"] = what
        # The edit goes into the graph's weights and out again: a copy per replay was
        # 23 MB at a 412k-event trace's peak.
        rows, cols, new = edit
        w = g.weights
        old = w[rows, cols]
        w[rows, cols] = new
        try:
            latest = cg.replay_latest(g, w, in_range)
        finally:
            w[rows, cols] = old
        items.at[i, "saved_ns"] = max(0, base - latest)
        done += 1
    items["saved_per_window_ns"] = (items["saved_ns"].astype("Float64") / max(windows, 1)).round()
    items["saved_per_window_ns"] = items["saved_per_window_ns"].astype("Int64")
    return items


def _activity_kinds(g: cg.Graph) -> np.ndarray:
    """The path kind of each activity's own duration (cpu, cuda_api, kernel, memcpy, …)."""
    e = 2 * np.arange(g.n_activities) + 1
    kind = g.kinds[e, 0]
    gpu_kind = np.asarray((*CLASSES, "none"), dtype=object)[np.minimum(g.cls, len(CLASSES))]
    out = np.where(kind == cg.DUR_GPU, gpu_kind, np.asarray(cg.KIND_NAMES, dtype=object)[kind])
    out[g.blocking] = "sync"  # a wait for the device: halving the call is no lever
    return out


def _scaled(g: cg.Graph, act_kind: np.ndarray, kind: str, name: str):
    """The edge weights that shorten one item, as (rows, columns, new weights), or None
    when it has no lever."""
    w = g.weights
    if kind in ("cpu", "cuda_api", "kernel", "memcpy", "memset", "comm"):
        acts = np.flatnonzero((g.name == name) & (act_kind == kind))
        rows, cols = 2 * acts + 1, np.zeros(len(acts), np.int64)
        return rows, cols, w[rows, cols] // 2
    if kind == "sync":
        acts = np.flatnonzero(g.name == name)
        ends = 2 * acts + 1
        sync = g.kinds[ends] == cg.SYNC
        rows, cols = np.nonzero(sync)
        return ends[rows], cols, np.full(len(rows), GONE, np.int64)
    if kind == "launch":  # the launches from calls of this name
        rows, cols = np.nonzero(g.kinds == cg.LAUNCH)
        hit = g.name[g.preds[rows, cols] // 2] == name
        rows, cols = rows[hit], cols[hit]
        return rows, cols, w[rows, cols] // 2
    if kind in ("gpu_gap", "host_gap"):  # the gaps before the activities of a thread/stream
        rows, cols = np.nonzero(g.kinds == (cg.GPU_GAP if kind == "gpu_gap" else cg.HOST_GAP))
        hit = g.resource[rows // 2] == name.removeprefix("gaps on ")
        rows, cols = rows[hit], cols[hit]
        return rows, cols, w[rows, cols] // 2
    return None


def _by_kind(segments: pd.DataFrame) -> pd.DataFrame:
    if not len(segments):
        return pd.DataFrame(columns=["rank_key", "kind", "bound", "path_ns", "share"])
    k = segments.groupby(["rank_key", "kind"], observed=True)["dur_ns"].sum()
    k = k.rename("path_ns").reset_index()
    k["bound"] = k["kind"].map(BOUND_OF)
    total = k.groupby("rank_key")["path_ns"].transform("sum")
    k["share"] = k["path_ns"] / total
    k["order"] = k["kind"].map({n: i for i, n in enumerate(KINDS)})
    return k.sort_values(["rank_key", "order"]).drop(columns="order").reset_index(drop=True)


def _windows(segments: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """The path cut at window boundaries: each window's time per kind."""
    out = []
    for rank, w in wins.groupby("rank_key", sort=True):
        segs = segments[segments["rank_key"].to_numpy() == rank]
        if not len(segs):
            continue
        lo, hi = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
        row = w[["rank_key", "step", "name"]].copy()
        row["wall_ns"] = hi - lo
        for kind in KINDS:
            mine = segs[segs["kind"].to_numpy() == kind]
            cov = union(mine["start_ns"], mine["end_ns"]).coverage()
            row[f"{kind}_ns"] = cov.between(lo, hi)
        out.append(row)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _concat(frames, columns) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
