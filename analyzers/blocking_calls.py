"""Which runtime calls make the host wait for device work, and for which work (the
critical path's host ← device edges, critical_path_graph.py).

CUDA's rules (runtime API, "API synchronization behavior"): a synchronize returns when
the work it names is done (the device's, a stream's, an event's); cudaMemcpy returns when
its copy is done, except device to device; cudaMemcpyAsync returns at once except to or
from pageable host memory, where it waits for its copy (device → pageable) or until the
copy has started from a staging buffer (pageable → device). Kineto names a copy by its
memory kinds ("Memcpy DtoH (Device -> Pageable)"), so which async copy blocks is read
from the copy the call launched, not guessed from the call's name (HTA counts every
cudaMemcpyAsync and cudaEventQuery as blocking). A Kineto "Stream Sync" event names the
stream a cudaStreamSynchronize waited for.

cudaStreamWaitEvent blocks no host: it makes a stream wait on another stream's work, an
edge between GPU ops (the graph's stream-wait edge). cudaEventQuery polls and returns.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .spans import CLASS_CODE, category_mask, pattern_mask

# A call that returns only when device work is done (gaps.py's rule for a host sync).
SYNC_CALL = re.compile(
    r"(?i)synchroni[sz]e|^(?:cuda|hip)Memcpy(?:2D|3D)?$|^cuMemcpy(?:DtoH|HtoD|DtoD)?(?:_v2)?$"
)
_SYNCHRONIZE = re.compile(r"(?i)synchroni[sz]e")
_COPY_CALL = re.compile(r"(?i)^(?:cuda|hip)Memcpy|^cuMemcpy")
_ASYNC = re.compile(r"(?i)async")
_PAGEABLE = re.compile(r"(?i)pageable")
_DEVICE_TO_DEVICE = re.compile(r"(?i)dtod|device\s*->\s*device|peer")


def is_pageable(copy_name: str) -> bool:
    """A Kineto copy to or from pageable host memory (its name says so)."""
    return bool(_PAGEABLE.search(copy_name))


def waits(
    df: pd.DataFrame, seg: pd.DataFrame, gpu: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocking calls that waited for device work: per call, its last CPU segment
    (where it returns), the GPU op it waited for and whether it waited for that op's end
    (else its start: a pageable → device copy returns once its copy has begun). Only
    waits the trace shows: the awaited end (start) lies inside the call."""
    out = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, bool))
    if not len(seg) or not len(gpu):
        return out
    runtime = seg["cls"].to_numpy() == CLASS_CODE["runtime"]
    span = seg["span"].to_numpy()
    last = runtime & np.r_[span[1:] != span[:-1], True]  # a call's last segment: its return
    calls = np.flatnonzero(last)
    if not len(calls):
        return out
    rows = span[calls]
    s = df["start_ns"].to_numpy(np.int64)[rows]  # the whole call, not its last segment
    e = df["end_ns"].to_numpy(np.int64)[rows]
    corr = df["correlation"].astype("float64").to_numpy()[rows]
    name_s = seg["name"].iloc[calls].reset_index(drop=True)  # categorical: rules per name
    copy = pattern_mask(name_s, _COPY_CALL)
    sync = pattern_mask(name_s, _SYNCHRONIZE)
    found = [_copy_waits(calls, s, e, corr, copy, pattern_mask(name_s, _ASYNC), gpu),
             _sync_waits(df, calls, s, e, corr, sync, gpu)]  # fmt: skip
    parts = [np.concatenate(x) for x in zip(*found, strict=True)]
    return parts[0], parts[1], parts[2]


def _copy_waits(calls, s, e, corr, copy, is_async, gpu):
    """A copy call waits for its own copy: a synchronous one unless device to device, an
    async one only to or from pageable memory."""
    gcorr = gpu["correlation"].to_numpy()
    ok = copy & ~np.isnan(corr)
    if not ok.any() or np.isnan(gcorr).all():
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, bool)
    has = ~np.isnan(gcorr)
    by_corr = pd.Series(np.flatnonzero(has), index=gcorr[has])
    by_corr = by_corr[~by_corr.index.duplicated(keep="last")]
    op = by_corr.reindex(corr[ok]).to_numpy()
    idx = np.flatnonzero(ok)[~np.isnan(op)]
    op = op[~np.isnan(op)].astype(np.int64)
    op_name = gpu["name"].iloc[op].reset_index(drop=True)
    pageable = pattern_mask(op_name, _PAGEABLE)
    d2d = pattern_mask(op_name, _DEVICE_TO_DEVICE)
    blocks = np.where(is_async[idx], pageable, ~d2d)
    idx, op = idx[blocks], op[blocks]
    g_s, g_e = gpu["start"].to_numpy(np.int64)[op], gpu["end"].to_numpy(np.int64)[op]
    inside_end = (g_e > s[idx]) & (g_e <= e[idx])
    inside_start = ~inside_end & (g_s > s[idx]) & (g_s <= e[idx])
    keep = inside_end | inside_start
    return calls[idx[keep]], op[keep], inside_end[keep]


def _sync_waits(df, calls, s, e, corr, sync, gpu):
    """A synchronize waits for the last op to end inside it: on the stream its Kineto
    'Stream Sync' event names, else on any stream (a device, an event: which one the
    trace does not say)."""
    idx = np.flatnonzero(sync)
    if not len(idx):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, bool)
    key = gpu["device"].to_numpy() * 1e9 + gpu["stream"].to_numpy()
    want = np.full(len(idx), np.nan)
    stream_sync = category_mask(df["category"], ["cuda_sync"]) & category_mask(
        df["name"], ["Stream Sync"]
    )
    if stream_sync.any():
        ev = df[stream_sync]
        k = (
            ev["device"].astype("float64").fillna(-1).to_numpy() * 1e9
            + ev["stream"].astype("float64").fillna(-1).to_numpy()
        )
        c = ev["correlation"].astype("float64").to_numpy()
        m = pd.Series(k[~np.isnan(c)], index=c[~np.isnan(c)])
        m = m[~m.index.duplicated(keep="first")]
        want = m.reindex(corr[idx]).to_numpy()
    end = gpu["end"].to_numpy(np.int64)
    op = np.full(len(idx), -1, np.int64)
    for stream in [np.nan, *np.unique(want[~np.isnan(want)])]:
        mine = np.isnan(want) if stream != stream else want == stream
        pool = np.arange(len(gpu)) if stream != stream else np.flatnonzero(key == stream)
        if not mine.any() or not len(pool):
            continue
        by_end = pool[np.argsort(end[pool], kind="stable")]
        ends = end[by_end]
        k = np.searchsorted(ends, e[idx[mine]], side="right") - 1
        got = np.where(k >= 0, by_end[np.maximum(k, 0)], -1)
        got[(k >= 0) & (ends[np.maximum(k, 0)] <= s[idx[mine]])] = -1
        op[mine] = got
    ok = op >= 0
    return calls[idx[ok]], op[ok], np.ones(int(ok.sum()), bool)
