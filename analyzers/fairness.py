"""Fairness: queue wait by prefix-hotness class, and the longest waits.

A cache-friendly scheduler admits requests whose prefix is cached first; unchecked, it
starves requests with cold prefixes. Classes come from the workload's prefix groups
(`requests.prefix_group`): the most requested groups that together hold at least
HOT_SHARE of the grouped requests are `hot`, the other groups `cold`; requests without
a group are `none`. Queue wait is the TTFT decomposition's queue part (ready to be
scheduled → the step that admitted it, plus any wait after a preemption).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .distribution import Dist
from .lifecycle import Lifecycle
from .steady_state import INTERNAL

HOT_SHARE = 0.5
LONGEST = 10
CLASSES = ("hot", "cold", "none")


@dataclass(frozen=True)
class ClassWait:
    hotness: str  # hot | cold | none
    groups: int
    requests: int
    queue_wait_s: Dist


@dataclass(frozen=True)
class Fairness:
    classes: tuple[ClassWait, ...]  # the classes present
    cold_over_hot_p50: float  # median cold wait / median hot wait (NaN without both)
    longest: pd.DataFrame  # request_id, prefix_group, hotness, queue_wait_s, ttft_s
    # The same for every measured request (the checks read it; not a table of its own).
    per_request: pd.DataFrame = field(default=None, metadata=INTERNAL)


def hotness(prefix_group: np.ndarray) -> np.ndarray:
    """hot / cold / none per request (see the module docstring)."""
    out = np.full(len(prefix_group), "none", dtype=object)
    grouped = ~np.isnan(prefix_group)
    if not grouped.any():
        return out
    counts = pd.Series(prefix_group[grouped]).value_counts()  # most requested first
    covered = counts.cumsum().to_numpy() / counts.sum()
    n_hot = int(np.searchsorted(covered, HOT_SHARE, side="left")) + 1
    hot = np.isin(prefix_group, counts.index.to_numpy()[:n_hot])
    out[grouped] = np.where(hot[grouped], "hot", "cold")
    return out


def fairness(lc: Lifecycle, ttft_parts: pd.DataFrame, select: np.ndarray) -> Fairness:
    """`ttft_parts`: the TTFT decomposition's per-request frame (request_id, queue_s)."""
    r = lc.requests
    group = r["prefix_group"].to_numpy()
    cls = hotness(group)
    pos = pd.Index(r["request_id"]).get_indexer(ttft_parts["request_id"])
    keep = select[pos]
    pos = pos[keep]
    wait = ttft_parts["queue_s"].to_numpy()[keep]
    frame = pd.DataFrame(
        {
            "request_id": r["request_id"].to_numpy()[pos],
            "prefix_group": pd.array(group[pos]).astype("Int64"),
            "hotness": cls[pos],
            "queue_wait_s": wait,
            "ttft_s": ttft_parts["ttft_s"].to_numpy()[keep],
        }
    )
    classes = []
    for name in CLASSES:
        mask = frame["hotness"].to_numpy() == name
        if mask.any():
            groups = frame["prefix_group"][mask].nunique()
            classes.append(ClassWait(name, int(groups), int(mask.sum()), Dist.of(wait[mask])))
    p50 = {c.hotness: c.queue_wait_s.p50 for c in classes}
    both = "cold" in p50 and "hot" in p50 and p50["hot"] > 0
    ratio = p50["cold"] / p50["hot"] if both else np.nan
    longest = frame.sort_values("queue_wait_s", ascending=False, ignore_index=True).head(LONGEST)
    return Fairness(tuple(classes), float(ratio), longest, frame)
