"""Triage step 4 as lanes over time: one lane per resource (each CPU thread, each GPU
stream), plus the engine's steps and the GPU's idle gaps labelled by cause, cut into
cells over a chosen window.

A resource lane is the union of its spans (intervals.union, once per run); a window's
cells read it with a cumulative coverage function, so moving or zooming the window costs
a binary search per cell edge, whatever the run's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analyzers.intervals import Coverage, union
from ..analyzers.spans import CLASS_CODE, GPU_CLASSES
from .data import RunData

MAX_LANES = 12
GAP_CHAR = {"host_bound": "h", "sync": "s", "launch_delay": "l", "no_work": "n",
            "host_wait": "w", "stream_wait": "e", "peer_wait": "p", "graph": "g",
            "unexplained": "x", "unlinked": "u"}  # fmt: skip
SHADES = " ░▒▓█"


@dataclass(frozen=True)
class Lane:
    name: str
    kind: str  # cpu | gpu | steps | gaps
    start: np.ndarray  # int64 ns, disjoint and sorted
    end: np.ndarray
    labels: np.ndarray | None = None  # one character per piece (steps, gaps)
    busy_ns: int = 0

    def cells(self, lo: int, hi: int, width: int) -> tuple[np.ndarray, list[str]]:
        """Per cell of [lo, hi): the share covered, and the character to draw."""
        edges = np.linspace(lo, hi, width + 1).astype(np.int64)
        cov = Coverage(self.start, self.end).between(edges[:-1], edges[1:])
        share = cov / np.maximum(np.diff(edges), 1)
        if self.labels is None:
            idx = np.minimum((share * 4).astype(int) + (share > 0), 4)
            return share, [SHADES[i] for i in idx]
        mid = (edges[:-1] + edges[1:]) // 2
        i = np.searchsorted(self.start, mid, side="right") - 1
        inside = (i >= 0) & (self.end[np.maximum(i, 0)] > mid)
        chars = [str(self.labels[j]) if ok else ("·" if s > 0 else " ")
                 for j, ok, s in zip(i, inside, share, strict=True)]  # fmt: skip
        return share, chars


@dataclass(frozen=True)
class Lanes:
    lanes: tuple[Lane, ...]
    lo: int  # the run's first and last traced instant
    hi: int
    default: tuple[int, int]  # the window shown first


def build_lanes(data: RunData) -> Lanes:
    df = data.spans
    lanes: list[Lane] = []
    if len(df):
        cls = df["cls"].to_numpy()
        on_gpu = df["on_gpu"].to_numpy()
        cpu = ~on_gpu & np.isin(cls, [CLASS_CODE[c] for c in ("runtime", "cpu", "comm")])
        gpu = on_gpu & np.isin(cls, [CLASS_CODE[c] for c in GPU_CLASSES])
        lanes += _resource_lanes(df, gpu, ["rank_key", "device", "stream"], "gpu")
        lanes += _resource_lanes(df, cpu, ["rank_key", "pid", "tid"], "cpu")
        lanes = sorted(lanes, key=lambda ln: (ln.kind != "gpu", -ln.busy_ns))[:MAX_LANES]
    steps = data.run.steps
    if len(steps):
        s = steps.sort_values("start_ns")
        pf, dec = s["num_prefill_tokens"].to_numpy(), s["num_decode_seqs"].to_numpy()
        kind = np.where(
            (pf > 0) & (dec > 0), "M", np.where(pf > 0, "P", np.where(dec > 0, "D", "·"))
        )
        start, end = s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64)
        lanes.insert(0, Lane("engine steps", "steps", start, np.maximum(end, start), kind,
                             int((end - start).sum())))  # fmt: skip
    tl = data.timeline
    if not len(steps) and tl is not None and len(tl.windows) > 1:
        lanes.insert(0, _window_lane(tl.windows))
    if tl is not None and len(tl.gaps):
        g = tl.gaps.sort_values("start_ns")
        chars = np.array([GAP_CHAR.get(str(c), "?") for c in g["cause"]])
        lanes.append(Lane("GPU idle cause", "gaps", g["start_ns"].to_numpy(np.int64),
                          g["end_ns"].to_numpy(np.int64), chars,
                          int(g["dur_ns"].sum())))  # fmt: skip
    bounds = [(int(ln.start.min()), int(ln.end.max())) for ln in lanes if len(ln.start)]
    lo = min((b[0] for b in bounds), default=0)
    hi = max((b[1] for b in bounds), default=1)
    return Lanes(tuple(lanes), lo, max(hi, lo + 1), _default_window(data, lo, hi))


def _window_lane(windows) -> Lane:
    """A foreign trace's profiler steps (ProfilerStep#N) of its first rank, each drawn
    with the last digit of its number so the boundaries show."""
    w = windows[windows["rank_key"] == windows["rank_key"].min()].sort_values("start_ns")
    start, end = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
    labels = np.array([str(s)[-1] if str(s).isdigit() else "#" for s in w["step"]])
    return Lane("profiler steps", "steps", start, np.maximum(end, start), labels,
                int((end - start).sum()))  # fmt: skip


def _resource_lanes(df, mask: np.ndarray, keys: list[str], kind: str) -> list[Lane]:
    sub = df.loc[mask, ["start_ns", "end_ns", "cls", *keys]]
    if not len(sub):
        return []
    from ..analyzers.spans import resource_codes

    codes = resource_codes(sub, keys)
    labels = sub.groupby(codes)[keys].first()
    only_comm = (sub["cls"] == CLASS_CODE["comm"]).groupby(codes).all()
    u = union(sub["start_ns"], sub["end_ns"], codes)
    out = []
    for code, row in labels.iterrows():
        piece = u.group == code
        rank = int(row[keys[0]])
        a, b = row[keys[1]], row[keys[2]]
        if kind == "gpu":
            name = f"gpu{_i(a)} s{_i(b)}"
        elif pd.isna(b):  # a rank's work with no thread named (tensor-parallel ranks)
            name = "comm" if only_comm[code] else "host"
        else:
            name = f"tid {_i(b)}"
        if rank >= 0:
            name = f"r{rank} {name}"
        start, end = u.start[piece], u.end[piece]
        out.append(Lane(name, kind, start, end, None, int((end - start).sum())))
    return out


def _i(v) -> str:
    return "?" if pd.isna(v) else str(int(v))


def _default_window(data: RunData, lo: int, hi: int) -> tuple[int, int]:
    """The first profiled steps when the run has op-level spans, else the first 20
    steps, else everything."""
    steps = data.run.steps
    if len(steps) > 20:
        s = steps.sort_values("start_ns")
        spans = data.spans
        kernels = spans[spans["cls"].to_numpy() == CLASS_CODE["kernel"]]
        first = int(kernels["start_ns"].min()) if len(kernels) else int(s["start_ns"].iloc[0])
        i = int(np.searchsorted(s["start_ns"].to_numpy(np.int64), first, side="right")) - 1
        i = max(i, 0)
        j = min(i + 20, len(s) - 1)
        return int(s["start_ns"].iloc[i]), int(s["end_ns"].iloc[j])
    return lo, hi


def window_breakdown(data: RunData, lo: int, hi: int) -> dict[str, float]:
    """The step-time breakdown classes (kernel … idle) inside [lo, hi), in ns: each
    instant counted once for the highest-priority class active (timeline.md)."""
    from ..analyzers.spans import CLASSES

    df = data.spans
    out: dict[str, float] = {}
    start, end = df["start_ns"].to_numpy(np.int64), df["end_ns"].to_numpy(np.int64)
    cls = df["cls"].to_numpy()
    inside = (end > lo) & (start < hi)
    covered = union(np.empty(0, np.int64), np.empty(0, np.int64))
    for name in CLASSES:
        m = inside & (cls == CLASS_CODE[name])
        s, e = np.clip(start[m], lo, hi), np.clip(end[m], lo, hi)
        both = union(np.r_[covered.start, s], np.r_[covered.end, e])
        out[name] = both.total_ns - covered.total_ns
        covered = both
    out["idle"] = (hi - lo) - covered.total_ns
    return out
