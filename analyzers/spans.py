"""The spans an analysis reads, with the classes and keys the timeline works in.

`timeline_spans(run)` reads only the columns the timeline needs (never `args`, which is
most of a trace's bytes) and adds:
- `cls`: the breakdown class of the span (kernel, memcpy, memset, comm, runtime, cpu)
  or "" when it occupies no resource (annotations, syncs, probes);
- `on_gpu`: the span sits on a GPU queue (device/stream) rather than a CPU thread;
- `rank_key`: the rank with -1 for none, `end_ns`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..traces.reader import Run, to_frame

COLUMNS = (
    "name", "category", "start_ns", "dur_ns", "pid", "tid", "device", "stream", "rank",
    "step_id", "correlation",
)  # fmt: skip

# Breakdown classes in priority order: an instant counts once, for the first active class.
CLASSES = ("kernel", "memcpy", "memset", "comm", "runtime", "cpu")
_CLASS_OF_CATEGORY = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "comm": "comm",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "cpu_op": "cpu",
    "python": "cpu",
    "phase": "cpu",
}
GPU_CLASSES = ("kernel", "memcpy", "memset", "comm")


def timeline_spans(run: Run) -> pd.DataFrame:
    table = run.tables["spans"]
    return prepare(to_frame("spans", table.select([c for c in COLUMNS if c in table.column_names])))


def prepare(spans: pd.DataFrame) -> pd.DataFrame:
    """Add `cls`, `on_gpu`, `rank_key`, `end_ns` to a spans frame (a copy, columns only)."""
    df = spans.loc[:, [c for c in COLUMNS if c in spans.columns]].copy()
    category = df["category"].astype("category")
    # Map the distinct categories (a handful), then index by code: no per-row Python.
    lookup = np.array(
        [_CLASS_OF_CATEGORY.get(str(c), "") for c in category.cat.categories] + [""], dtype=object
    )
    cls = lookup[category.cat.codes.to_numpy()]  # code -1 (null) picks the trailing ""
    df["on_gpu"] = df["device"].notna().to_numpy() & df["pid"].isna().to_numpy()
    # A comm span on a CPU thread (gloo, record_param_comms) is comm as well; a kernel-like
    # category without a GPU queue (malformed) occupies nothing.
    gpu_only = np.isin(cls, ["kernel", "memcpy", "memset"])
    cls[gpu_only & ~df["on_gpu"].to_numpy()] = ""
    df["cls"] = pd.Categorical(cls, categories=[*CLASSES, ""])
    df["rank_key"] = df["rank"].fillna(-1).astype("int64").to_numpy()
    df["end_ns"] = df["start_ns"].to_numpy(np.int64) + df["dur_ns"].to_numpy(np.int64)
    return df


def resource_codes(df: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Integer codes for the groups defined by `keys` (nulls as a value of their own)."""
    frame = df[keys].astype("float64").fillna(-(2.0**60))  # ids fit float64 exactly
    return frame.groupby(keys, sort=True).ngroup().to_numpy(np.int64)
