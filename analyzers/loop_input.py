"""Input processing on the loop that drives the engine's steps.

The reference engine takes a request in on the thread that calls `add_request`: the
asyncio loop with AsyncLLMEngine, which is also the loop that awaits each step on the
one-thread step executor and submits the next; the caller's own stepping thread with
LLMEngine. The arrival event is stamped inside `add_request` and tokenize_end when
validation and tokenisation are done, so [arrival, tokenize_end] is time that thread
spent on one request's input (probes/faults.py's input delay sits there too). While it
does, the next step cannot be submitted: the part of a gap between steps covered by
such intervals is the input's time — already in TTFT before the engine queue, the
slow-input check's — not the engine's host work between forward passes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .intervals import Coverage, union


def input_intervals(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) in ns of each request's engine-side intake: arrival → tokenize_end."""
    if not len(events):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    e = events[(events["side"] == "engine").to_numpy()]
    first = e.groupby(["request_id", "kind"], observed=True)["ts_ns"].min().unstack()
    if "arrival" not in first or "tokenize_end" not in first:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    both = first[["arrival", "tokenize_end"]].dropna()
    return both["arrival"].to_numpy(np.int64), both["tokenize_end"].to_numpy(np.int64)


def input_s_between(events: pd.DataFrame, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Seconds of each window [a, b) (ns, the run's clock) in which some request was
    being taken in (overlapping intakes counted once: one loop runs them in turn)."""
    start, end = input_intervals(events)
    u = union(start, end)
    if not len(u):
        return np.zeros(len(a))
    return Coverage(u.start, u.end).between(np.asarray(a, np.int64), np.asarray(b, np.int64)) / 1e9
