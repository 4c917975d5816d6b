"""Kernel and CPU-op breakdowns: count, total, mean and p99 per name and per kernel class
(GEMM, attention, elementwise, normalisation, communication, copy, other).

Classes come from the kernel's name, matched once per distinct name (names are
categorical), in the order below: the first rule that matches wins.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .spans import category_mask, cls_mask, group_codes, id_array

KERNEL_CLASSES = (
    "communication", "copy", "attention", "gemm", "normalisation", "elementwise", "other",
)  # fmt: skip
_RULES = (
    ("communication", re.compile(r"(?i)nccl|rccl|all_?reduce|all_?gather|reduce_?scatter")),
    ("copy", re.compile(r"(?i)memcpy|memset|copy|cat_?array|nchwtonhwc|nhwctonchw")),
    ("attention", re.compile(r"(?i)flash|fmha|attention|attn|sdpa|mha_|xformers|cutlassf")),
    (
        "gemm",
        re.compile(
            r"(?i)gemm|gemv|matmul|cublas|cutlass|xmma|wgmma|hmma|\bmm_|_mm\b|bmm|addmm|"
            r"cijk_|triton_tem|triton_mm|conv|winograd|scudnn|dgrad|wgrad|fprop"
        ),
    ),
    ("normalisation", re.compile(r"(?i)norm|bn_fw|bn_bw|rms")),
    (
        "elementwise",
        re.compile(
            r"(?i)elementwise|vectorized|unrolled|pointwise|triton_(poi|red|per)|reduce|"
            r"softmax|fill|gelu|silu|relu|sigmoid|tanh|rotary|rope|index|gather|scatter|"
            r"embedding|argmax|topk|sort|distribution|random|uniform|foreach|multi_tensor|"
            r"add|mul|div|sub"
        ),
    ),
)
_BY_CATEGORY = {"gpu_memcpy": "copy", "gpu_memset": "copy", "comm": "communication"}


def kernel_class(name: str) -> str:
    for cls, rule in _RULES:
        if rule.search(name):
            return cls
    return "other"


def classify(names: pd.Series, categories: pd.Series | None = None) -> np.ndarray:
    """The kernel class of each row, computed once per distinct name."""
    cat = names.astype("category")
    lookup = np.array([kernel_class(str(n)) for n in cat.cat.categories] + ["other"], dtype=object)
    out = lookup[cat.cat.codes.to_numpy()]
    if categories is not None:
        for category, cls in _BY_CATEGORY.items():
            out[category_mask(categories.astype("category"), [category])] = cls
    return out


def _stats(frame: pd.DataFrame, by: str | list[str]) -> pd.DataFrame:
    g = frame.groupby(by, sort=False, observed=True)["dur_ns"]
    out = g.agg(count="size", total_ns="sum", mean_ns="mean", max_ns="max")
    out["p99_ns"] = g.quantile(0.99)
    total = out["total_ns"].sum()
    out["share_pct"] = 100.0 * out["total_ns"] / total if total else np.nan
    return out.sort_values("total_ns", ascending=False).reset_index()


def kernel_breakdown(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per kernel class, per kernel name) over the GPU work (kernels, copies, sets, comm)."""
    mask = df["on_gpu"].to_numpy() & cls_mask(df, "kernel", "memcpy", "memset", "comm")
    gpu = df.loc[mask, ["name", "category", "dur_ns"]]
    frame = pd.DataFrame(
        {
            # Grouped by its codes; a name's text is made once per name, not per span.
            "name": gpu["name"].astype("category").array,
            "dur_ns": gpu["dur_ns"].to_numpy(np.int64),
            "kernel_class": classify(gpu["name"], gpu["category"]),
        }
    )
    if not len(frame):
        return pd.DataFrame(), pd.DataFrame()
    by_name = _names_as_text(_stats(frame, ["name", "kernel_class"]))
    return _stats(frame, "kernel_class"), by_name


def op_breakdown(df: pd.DataFrame) -> pd.DataFrame:
    """Per CPU-op name: count, total (inclusive), mean, p99, max, and self time (the
    time not inside a nested op: aten::linear contains aten::matmul contains aten::mm,
    so inclusive totals add up to more than the thread's time). Sorted by self time;
    `self_share_pct` is the share of all ops' self time, which adds up to 100."""
    mask = category_mask(df["category"], ["cpu_op"])
    ops = df.loc[mask, ["name", "dur_ns", "start_ns", "rank_key", "pid", "tid"]]
    if not len(ops):
        return pd.DataFrame()
    start = ops["start_ns"].to_numpy(np.int64)
    dur = ops["dur_ns"].to_numpy(np.int64)
    thread, _ = group_codes([ops["rank_key"].to_numpy(np.int64), id_array(ops["pid"]),
                             id_array(ops["tid"])])  # fmt: skip
    frame = pd.DataFrame(
        {
            "name": ops["name"].astype("category").array,
            "dur_ns": dur,
            "self_ns": self_time_ns(start, start + dur, thread),
        }
    )
    out = _stats(frame, "name")
    self_total = frame.groupby("name", sort=False, observed=True)["self_ns"].sum()
    out["self_ns"] = self_total.reindex(out["name"]).to_numpy(np.int64)
    out = _names_as_text(out)
    whole = out["self_ns"].sum()
    out["self_share_pct"] = 100.0 * out["self_ns"] / whole if whole else np.nan
    return out.sort_values("self_ns", ascending=False, ignore_index=True)


def _names_as_text(out: pd.DataFrame) -> pd.DataFrame:
    """The per-name table's names as text (they were grouped as categories)."""
    out["name"] = out["name"].astype(str)
    return out


def self_time_ns(start: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """Each span's duration less its direct children's: spans of the same thread one
    nesting level down that start inside it. Depth comes from a sweep over start and end
    events (an end before a start at the same instant: touching spans do not nest; of
    spans starting together the longer is outside); a child's parent is the last span one
    level up, in start order, before it. No Python loop over spans: one pass per depth."""
    n = len(start)
    if n == 0:
        return np.zeros(0, np.int64)
    times = np.concatenate([start, end])
    kind = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    outer_first = np.concatenate([-end, np.zeros(n, np.int64)])
    span = np.concatenate([np.arange(n), np.arange(n)])
    threads = np.concatenate([thread, thread])
    order = np.lexsort((outer_first, kind, times, threads))
    running = np.cumsum(kind[order])
    starts = kind[order] == 1
    depth = np.empty(n, np.int64)
    depth[span[order][starts]] = running[starts] - 1
    by_start = span[order][starts]  # spans in (thread, start, outer first) order
    d_sorted = depth[by_start]
    children = np.zeros(n, np.float64)
    dur = (end - start).astype(np.float64)
    for d in range(1, int(depth.max()) + 1 if n else 1):
        parents_at = np.flatnonzero(d_sorted == d - 1)
        kids_at = np.flatnonzero(d_sorted == d)
        if not len(kids_at) or not len(parents_at):
            continue
        parent = by_start[parents_at[np.searchsorted(parents_at, kids_at) - 1]]
        children += np.bincount(parent, weights=dur[by_start[kids_at]], minlength=n)
    return np.maximum(dur - children, 0).astype(np.int64)
