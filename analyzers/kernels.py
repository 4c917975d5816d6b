"""Kernel and CPU-op breakdowns: count, total, mean and p99 per name and per kernel class
(GEMM, attention, elementwise, normalisation, communication, copy, other).

Classes come from the kernel's name, matched once per distinct name (names are
categorical), in the order below: the first rule that matches wins.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .spans import category_mask, cls_mask

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
            "name": gpu["name"].astype("category").to_numpy(),
            "dur_ns": gpu["dur_ns"].to_numpy(np.int64),
            "kernel_class": classify(gpu["name"], gpu["category"]),
        }
    )
    if not len(frame):
        return pd.DataFrame(), pd.DataFrame()
    by_name = _stats(frame, ["name", "kernel_class"])
    return _stats(frame, "kernel_class"), by_name


def op_breakdown(df: pd.DataFrame) -> pd.DataFrame:
    """Per CPU-op name: count, total (inclusive), mean, p99, max."""
    ops = df.loc[category_mask(df["category"], ["cpu_op"]), ["name", "dur_ns"]]
    if not len(ops):
        return pd.DataFrame()
    frame = pd.DataFrame(
        {
            "name": ops["name"].astype("category").to_numpy(),
            "dur_ns": ops["dur_ns"].to_numpy(np.int64),
        }
    )
    return _stats(frame, "name")
