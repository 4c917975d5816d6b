"""The trace diff: what changed between the spans of two runs (imported traces, or runs
recorded with a profiler window), normalised per step.

- Steps: a recorded run's engine steps inside its profiler window (`captured_steps`), else
  an imported trace's `ProfilerStep#N` annotations (one window per step and rank, as in
  the timeline), else the whole trace as one "step". Counts and times are divided by the
  number of step windows (steps × ranks), so two traces of different lengths compare.
  A window is the step's CPU span on both sides (never extended to the GPU work of the
  last step, which differs between traces): host spans count when they start inside it,
  GPU work when its launch call does (by correlation id; unlinked GPU work by its start).
- Per name, split CPU (ops, annotations, engine phases), runtime (launch, copy and sync
  API calls) and GPU (kernels, copies, memsets, collectives): calls and time per step in
  A and B, the deltas, and whether the name was added, removed, changed or is the same.
  CPU time is inclusive (an op's time contains the ops it calls); GPU time is the sum of
  the ops' durations. Rows are ranked by the absolute change of time per step.
- Runtime calls by API with the GPU ops each launched (joined by correlation id): the
  launches by kind (cudaLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch, …) and the rest;
  copies by kind (DtoD, HtoD, DtoH, …, memset) with bytes per step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..traces.reader import Run, to_frame
from . import gaps, timeline
from .spans import COLUMNS, category_mask, cls_mask, pattern_mask, prepare

WORK_CATEGORIES = (
    "cpu_op", "python", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset",
    "comm",
)  # fmt: skip  # a run holds a trace when it has spans of one of these
_SKIP_CATEGORIES = ("probe",)  # perfdiag's own profiler overhead: not the workload's
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_COPY_KIND = re.compile(r"(?i)\b(DtoD|HtoD|DtoH|HtoH|PtoP|DtoA|AtoD|AtoH|HtoA|AtoA)\b")
STATUSES = ("added", "removed", "changed", "same")
SIDES = ("gpu", "cpu", "runtime")
DIFF_COLUMNS = [
    "side", "kind", "name", "status", "calls_a", "calls_b", "calls_delta", "time_a_ns",
    "time_b_ns", "time_delta_ns", "time_rel",
]  # fmt: skip


@dataclass(frozen=True)
class StepBasis:
    """What one run's per-step figures are divided by."""

    source: str  # engine_steps | ProfilerStep | trace
    windows: int  # step windows (steps × ranks): the divisor
    steps: int  # distinct steps
    ranks: int
    first: int | None  # first and last step number, where numbered
    last: int | None
    wall_ns_per_step: float  # mean window length

    @property
    def text(self) -> str:
        span = f" ({self.first}–{self.last})" if self.first is not None else ""
        ranks = f" on {self.ranks} ranks" if self.ranks > 1 else ""
        if self.source == "engine_steps":
            return f"{self.steps} engine steps{span} in the profiler window{ranks}"
        if self.source == "ProfilerStep":
            return f"{self.steps} ProfilerStep# annotations{span}{ranks}"
        return f"no steps marked: the whole trace counts as one step{ranks}"


@dataclass(frozen=True)
class TraceDiff:
    basis_a: StepBasis
    basis_b: StepBasis
    totals: pd.DataFrame  # metric, unit, a, b, delta (per step)
    ops: pd.DataFrame  # DIFF_COLUMNS, ranked by |time_delta_ns|
    launches: pd.DataFrame  # launch_name, calls_*, ops_* (GPU ops launched) per step
    copies: pd.DataFrame  # copy_kind, calls_*, time_*_ns, bytes_* per step

    def changed(self, side: str | None = None) -> pd.DataFrame:
        ops = self.ops if side is None else self.ops[self.ops["side"] == side]
        return ops[ops["status"] != "same"]


def holds_trace(run: Run) -> bool:
    """Whether the run has profiler spans (CPU ops, runtime calls, GPU work) to diff."""
    if not run.manifest.tables.get("spans", {}).get("rows", 1):
        return False
    cats = to_frame("spans", run.arrow("spans", ["category"]))["category"]
    return bool(len(cats)) and bool(category_mask(cats.astype("category"), WORK_CATEGORIES).any())


def _spans(run: Run) -> pd.DataFrame:
    table = to_frame("spans", run.arrow("spans", [*COLUMNS, "bytes"]))
    df = prepare(table)
    df["bytes"] = table["bytes"].to_numpy("float64", na_value=np.nan)
    return df


def _captured(run: Run) -> tuple[int, int] | None:
    window = (run.manifest.extra or {}).get("profiler_window") or {}
    got = window.get("captured_steps")
    if isinstance(got, list | tuple) and len(got) == 2 and all(isinstance(v, int) for v in got):
        return int(got[0]), int(got[1])
    return None


def step_windows(run: Run, df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The windows that count and their source (engine_steps | ProfilerStep | trace)."""
    steps = run.steps
    captured = _captured(run)
    if len(steps) and captured is not None:
        ids = steps["step_id"].to_numpy(np.int64)
        sel = steps[(ids >= captured[0]) & (ids <= captured[1])]
        if len(sel):
            return timeline.windows(df, sel), "engine_steps"
    wins = timeline.windows(df, None)
    return wins, str(wins["source"].iloc[0]) if len(wins) else "trace"


def cpu_windows(df: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """The windows cut back to their step annotation's own CPU span: the timeline extends a
    last ProfilerStep (or a vLLM step) to the end of the GPU work it launched, which differs
    between two traces of one program and would let a call made after the step count."""
    marks = df[~df["on_gpu"].to_numpy() & category_mask(df["category"], ["annotation"])]
    marks = pd.DataFrame(
        {
            "rank_key": marks["rank_key"].to_numpy(),
            "name": marks["name"].astype(str).to_numpy(dtype=object),
            "start_ns": marks["start_ns"].to_numpy(np.int64),
            "mark_end_ns": pd.array(marks["end_ns"].to_numpy(np.int64), dtype="Int64"),
        }
    ).drop_duplicates(["rank_key", "name", "start_ns"])
    w = wins.assign(name=wins["name"].astype(str)).merge(
        marks, on=["rank_key", "name", "start_ns"], how="left", sort=False
    )
    end = w["end_ns"].to_numpy(np.int64).copy()
    found = w["mark_end_ns"].notna().to_numpy()  # engine steps, whole traces: not found
    mark_end = w["mark_end_ns"].fillna(0).to_numpy(np.int64)  # int: 1.7e18 ns stays exact
    cut = found & (mark_end < end)
    end[cut] = mark_end[cut]
    return wins.assign(end_ns=end)


def _extent(wins: pd.DataFrame, by_rank: bool, ranks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per span's rank: the first window's start and the last one's end, in integer ns (a
    float would round 1.7e18 ns to 256); a rank with no window gets an empty extent."""
    if not by_rank:
        lo, hi = int(wins["start_ns"].min()), int(wins["end_ns"].max())
        return np.full(len(ranks), lo, np.int64), np.full(len(ranks), hi, np.int64)
    span = wins.groupby("rank_key").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    lo = span["lo"].reindex(ranks, fill_value=np.iinfo(np.int64).max).to_numpy(np.int64)
    hi = span["hi"].reindex(ranks, fill_value=np.iinfo(np.int64).min).to_numpy(np.int64)
    return lo, hi


def _in_windows(df: pd.DataFrame, wins: pd.DataFrame, by_rank: bool) -> np.ndarray:
    """Spans that belong to the steps, the same way on both sides of a diff: a host span
    when it starts inside the steps' CPU extent (per rank for ProfilerStep windows); GPU
    work when the call that launched it (same correlation id) does, and unlinked GPU work
    when it starts inside the windows as the timeline draws them (with the GPU tail)."""
    ranks = df["rank_key"].to_numpy()
    start = df["start_ns"].to_numpy(np.int64)
    lo, hi = _extent(cpu_windows(df, wins), by_rank, ranks)
    inside = (start >= lo) & (start <= hi)
    joined = gaps.launch_join(df)  # span_index: the GPU op's position in df
    if len(joined):
        pos = df.index.get_indexer(joined["span_index"].to_numpy())
        linked = joined["linked"].to_numpy()
        launch = joined["launch_start_ns"].fillna(0).to_numpy(np.int64)
        by_launch = (launch >= lo[pos]) & (launch <= hi[pos])
        wide_lo, wide_hi = _extent(wins, by_rank, ranks[pos])
        by_start = (start[pos] >= wide_lo) & (start[pos] <= wide_hi)
        inside[pos] = np.where(linked, by_launch, by_start)
    return inside


def _basis(wins: pd.DataFrame, source: str, df: pd.DataFrame) -> StepBasis:
    ranks = max(1, int(pd.unique(df["rank_key"]).size)) if len(df) else 1
    numbered = wins["step"].dropna() if "step" in wins else pd.Series(dtype="Int64")
    steps = int(numbered.nunique()) if len(numbered) else 1
    windows = len(wins) if source == "ProfilerStep" else steps * ranks
    wall = (wins["end_ns"] - wins["start_ns"]).to_numpy("float64")
    return StepBasis(
        source=source,
        windows=max(1, windows),
        steps=steps,
        ranks=ranks,
        first=int(numbered.min()) if len(numbered) else None,
        last=int(numbered.max()) if len(numbered) else None,
        wall_ns_per_step=float(wall.mean()) if len(wall) else float("nan"),
    )


def _side_kind(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per span: side (gpu | cpu | runtime | '' for spans left out) and kind."""
    n = len(df)
    side = np.full(n, "", dtype=object)
    kind = df["category"].astype(str).to_numpy(dtype=object)
    on_gpu = df["on_gpu"].to_numpy()
    work = cls_mask(df, "kernel", "memcpy", "memset", "comm")
    side[on_gpu & work] = "gpu"
    runtime = cls_mask(df, "runtime")
    side[~on_gpu & runtime] = "runtime"
    cpu = ~on_gpu & ~runtime & ~category_mask(df["category"], _SKIP_CATEGORIES)
    cpu &= ~category_mask(df["category"], ["cuda_sync"])  # a sync record, not an op
    cpu &= ~pattern_mask(df["name"], _PROFILER_STEP)  # the steps themselves
    side[cpu] = "cpu"
    gpu_annotation = on_gpu & category_mask(df["category"], ["annotation"])
    side[gpu_annotation] = ""  # a GPU-side copy of a CPU annotation: counted once, on the CPU
    return side, kind


def _per_name(df: pd.DataFrame, n: int) -> pd.DataFrame:
    side, kind = _side_kind(df)
    keep = side != ""
    frame = pd.DataFrame(
        {
            "side": side[keep],
            "kind": kind[keep],
            "name": df["name"].astype(str).to_numpy(dtype=object)[keep],
            "dur_ns": df["dur_ns"].to_numpy(np.int64)[keep],
        }
    )
    g = frame.groupby(["side", "kind", "name"], sort=False)["dur_ns"]
    out = g.agg(calls="size", time_ns="sum").reset_index()
    out["calls"] = out["calls"] / n
    out["time_ns"] = out["time_ns"].astype("float64") / n
    return out


def _diff(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    m = a.merge(b, on=["side", "kind", "name"], how="outer", suffixes=("_a", "_b"))
    for col in ("calls_a", "calls_b", "time_ns_a", "time_ns_b"):
        m[col] = m[col].fillna(0.0).astype("float64")
    out = pd.DataFrame(
        {
            "side": m["side"],
            "kind": m["kind"],
            "name": m["name"],
            "calls_a": m["calls_a"],
            "calls_b": m["calls_b"],
            "calls_delta": m["calls_b"] - m["calls_a"],
            "time_a_ns": m["time_ns_a"],
            "time_b_ns": m["time_ns_b"],
            "time_delta_ns": m["time_ns_b"] - m["time_ns_a"],
        }
    )
    ta = out["time_a_ns"].to_numpy()
    out["time_rel"] = np.where(ta > 0, out["time_delta_ns"] / np.where(ta > 0, ta, 1), np.nan)
    status = np.full(len(out), "changed", dtype=object)
    status[(out["calls_a"] == 0).to_numpy()] = "added"
    status[(out["calls_b"] == 0).to_numpy()] = "removed"
    same = (out["calls_delta"] == 0).to_numpy() & (out["time_delta_ns"] == 0).to_numpy()
    status[same & (status == "changed")] = "same"
    out.insert(3, "status", status)
    order = np.lexsort((out["name"].to_numpy(), -out["time_delta_ns"].abs().to_numpy()))
    return out.iloc[order].reset_index(drop=True)[DIFF_COLUMNS]


def _launches(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """Per launch API: calls per step and the GPU ops they launched per step."""
    joined = gaps.launch_join(df)
    linked = joined[joined["linked"].to_numpy()]
    ops = linked.groupby(linked["launch_name"].astype(str)).size()
    runtime = df[cls_mask(df, "runtime") & ~df["on_gpu"].to_numpy()]
    calls = runtime.groupby(runtime["name"].astype(str)).size()
    time = runtime.groupby(runtime["name"].astype(str))["dur_ns"].sum()
    out = pd.DataFrame({"calls": calls, "call_time_ns": time}).join(ops.rename("ops"), how="left")
    out = out.fillna({"ops": 0}).astype("float64") / n
    return out.rename_axis("launch_name").reset_index()


def _copies(df: pd.DataFrame, n: int) -> pd.DataFrame:
    on_gpu = df["on_gpu"].to_numpy()
    sel = df[on_gpu & cls_mask(df, "memcpy", "memset")]
    if not len(sel):
        return pd.DataFrame(columns=["copy_kind", "calls", "time_ns", "bytes"])
    names = sel["name"].astype("category")
    kinds = []
    for c in names.cat.categories:  # a handful of distinct names
        hit = _COPY_KIND.search(str(c))
        kinds.append(hit.group(1) if hit else ("memset" if "set" in str(c).lower() else "other"))
    kind = np.array([*kinds, "other"], dtype=object)[names.cat.codes.to_numpy()]
    memset = cls_mask(sel, "memset")
    kind[memset] = "memset"
    frame = pd.DataFrame(
        {"copy_kind": kind, "dur_ns": sel["dur_ns"].to_numpy(np.int64), "bytes": sel["bytes"]}
    )
    g = frame.groupby("copy_kind", sort=True)
    out = pd.DataFrame(
        {"calls": g.size(), "time_ns": g["dur_ns"].sum(), "bytes": g["bytes"].sum(min_count=1)}
    )
    return (out.astype("float64") / n).reset_index()


def _pair(a: pd.DataFrame, b: pd.DataFrame, key: str) -> pd.DataFrame:
    """Outer join of two per-step tables on `key`, 0 where absent, with deltas."""
    m = a.merge(b, on=key, how="outer", suffixes=("_a", "_b"))
    values = [c for c in a.columns if c != key]
    for c in values:
        for s in ("_a", "_b"):
            m[c + s] = m[c + s].astype("float64")
        if c != "bytes":
            m[c + "_a"] = m[c + "_a"].fillna(0.0)
            m[c + "_b"] = m[c + "_b"].fillna(0.0)
        m[c + "_delta"] = m[c + "_b"] - m[c + "_a"]
    cols = [key] + [f"{c}{s}" for c in values for s in ("_a", "_b", "_delta")]
    first = values[0]
    m = m[cols]
    order = np.lexsort((m[key].astype(str).to_numpy(), -m[f"{first}_delta"].abs().to_numpy()))
    return m.iloc[order].reset_index(drop=True)


@dataclass(frozen=True)
class _Side:
    basis: StepBasis
    per_name: pd.DataFrame
    launches: pd.DataFrame
    copies: pd.DataFrame
    gpu_busy_ns: float  # union of GPU work per step


def _one(run: Run) -> _Side:
    df = df_all = _spans(run)
    wins, source = step_windows(run, df)
    inside = _in_windows(df, wins, by_rank=source == "ProfilerStep") if len(wins) else None
    if inside is not None:
        df = df[inside]
    basis = _basis(cpu_windows(df_all, wins) if len(wins) else wins, source, df)
    n = basis.windows
    on_gpu = df["on_gpu"].to_numpy() & cls_mask(df, "kernel", "memcpy", "memset", "comm")
    busy = 0.0
    if on_gpu.any():
        from .intervals import union

        work = df[on_gpu]
        codes = work["rank_key"].to_numpy() * 4096 + work["device"].astype("int64").to_numpy()
        u = union(work["start_ns"].to_numpy(np.int64), work["end_ns"].to_numpy(np.int64), codes)
        busy = float((u.end - u.start).sum()) / n
    return _Side(basis, _per_name(df, n), _launches(df, n), _copies(df, n), busy)


def _totals(a: _Side, b: _Side) -> pd.DataFrame:
    def sums(s: _Side) -> dict[str, float]:
        p = s.per_name
        gpu = p[p["side"] == "gpu"]
        return {
            "step wall time": s.basis.wall_ns_per_step,
            "GPU busy (union)": s.gpu_busy_ns,
            "GPU op time (sum)": float(gpu["time_ns"].sum()),
            "GPU ops": float(gpu["calls"].sum()),
            "runtime calls": float(p.loc[p["side"] == "runtime", "calls"].sum()),
            "CPU ops": float(p.loc[p["kind"] == "cpu_op", "calls"].sum()),
        }

    units = {"GPU ops": "calls", "runtime calls": "calls", "CPU ops": "calls"}
    sa, sb = sums(a), sums(b)
    return pd.DataFrame(
        {
            "metric": list(sa),
            "unit": [units.get(k, "ns") for k in sa],
            "a": list(sa.values()),
            "b": list(sb.values()),
            "delta": [sb[k] - sa[k] for k in sa],
        }
    )


def trace_diff(a: Run, b: Run) -> TraceDiff | None:
    """The diff of two runs' spans, or None when either holds no trace."""
    if not (holds_trace(a) and holds_trace(b)):
        return None
    sa, sb = _one(a), _one(b)
    launches = _pair(sa.launches, sb.launches, "launch_name")
    return TraceDiff(
        basis_a=sa.basis,
        basis_b=sb.basis,
        totals=_totals(sa, sb),
        ops=_diff(sa.per_name, sb.per_name),
        launches=launches,
        copies=_pair(sa.copies, sb.copies, "copy_kind"),
    )
