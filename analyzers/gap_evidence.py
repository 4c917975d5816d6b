"""What work that was already launched waited for when the GPU sat idle before it: the
evidence for an idle gap whose next op's launch call began before the GPU ran dry
(definitions in docs/timeline.md). Checked in this order, the first that holds wins:

- `host_wait`: the GPU idled past any plausible launch latency while the host sat in a
  synchronisation or event wait for at least half the gap (the queued work and the host
  both waited on something else);
- `stream_wait`: the op's stream was told to wait for an event (a `Stream Wait Event`
  record on its stream between its launch and its start): another stream's work;
- `peer_wait`: the op is a collective, which starts when its peers are ready, and the GPU
  idled past any plausible launch latency before it;
- `graph`: the op is a node of a CUDA graph, whose launch call is the graph's, not its own:
  it waited for the graph's earlier nodes and dependencies, not for a launch;
- `unexplained`: the GPU idled longer than any plausible launch latency with the work
  queued and nothing in the trace says why (or the clocks of host and device disagree);
- `launch_delay`: what is left, launch latency and kernel-to-kernel overhead.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .intervals import union
from .spans import category_mask, cls_mask, pattern_mask

# A launch reaches the GPU in ~5–20 µs, a few hundred µs under a heavy profiler: a queued
# op that still waits 1 ms on an idle GPU waited for something else.
PLAUSIBLE_LAUNCH_NS = 1_000_000
OFFERED_CAUSES = ("host_wait", "stream_wait", "peer_wait", "graph", "unexplained", "launch_delay")
_GRAPH_LAUNCH = re.compile(r"(?i)graphlaunch")
_STREAM_WAIT = "Stream Wait Event"


def host_syncs(df: pd.DataFrame, rank: int, sync_call: re.Pattern) -> pd.DataFrame:
    """The rank's host-side synchronisations (runtime calls that wait, `cuda_sync` records
    other than a stream's wait), sorted by start: start_ns, end_ns, name."""
    mine = df["rank_key"].to_numpy() == rank
    by_name = pattern_mask(df["name"], sync_call) & cls_mask(df, "runtime")
    cuda_sync = category_mask(df["category"], ["cuda_sync"])
    sel = mine & (by_name | cuda_sync) & ~category_mask(df["name"], [_STREAM_WAIT])
    out = pd.DataFrame(
        {
            "start_ns": df["start_ns"].to_numpy(np.int64)[sel],
            "end_ns": df["end_ns"].to_numpy(np.int64)[sel],
            "name": df["name"][sel].astype(str).to_numpy(dtype=object),  # not every row's
        }
    )
    return out.sort_values("start_ns", kind="stable", ignore_index=True)


def sync_name_at(syncs: pd.DataFrame, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per window [a, b): the name of the last synchronisation starting before b that
    reaches past a ('' when none does)."""
    starts, ends = syncs["start_ns"].to_numpy(np.int64), syncs["end_ns"].to_numpy(np.int64)
    names = syncs["name"].to_numpy(dtype=object)
    out = np.full(len(a), "", dtype=object)
    i = np.searchsorted(starts, b, side="left") - 1
    ok = i >= 0
    ok[ok] = ends[i[ok]] > a[ok]
    out[ok] = names[i[ok]]
    return out


def _stream_waited(df: pd.DataFrame, g: pd.DataFrame, launch: np.ndarray) -> np.ndarray:
    """Per gap: a stream-wait-event on the next op's stream between its launch and start."""
    waits = df[category_mask(df["name"], [_STREAM_WAIT])]
    out = np.zeros(len(g), bool)
    if not len(waits) or not len(g):
        return out
    key = ["rank_key", "device", "stream"]
    w = waits[[*key, "start_ns"]].dropna().astype("int64")
    at = pd.DataFrame(
        {
            "rank_key": g["rank_key"].to_numpy(),
            "device": g["device"].to_numpy("float64", na_value=np.nan),
            "stream": g["next_stream"].to_numpy("float64", na_value=np.nan),
            "launch": launch,
            "op": g["end_ns"].to_numpy(np.int64),
            "row": np.arange(len(g)),
        }
    ).dropna()
    if not len(w) or not len(at):
        return out
    at[["device", "stream"]] = at[["device", "stream"]].astype("int64")
    m = at.merge(w, on=key, how="inner")
    hit = (m["start_ns"] >= m["launch"]) & (m["start_ns"] <= m["op"])
    out[m.loc[hit.to_numpy(), "row"].to_numpy(np.int64)] = True
    return out


def offered(
    df: pd.DataFrame, g: pd.DataFrame, sync_call: re.Pattern, busy_fraction: float
) -> tuple[np.ndarray, ...]:
    """(cause, waited_on) for gaps whose next op was launched before the gap began. `g`
    holds the gaps' rows (start_ns, end_ns, dur_ns, rank_key, device, next_stream, next_cls,
    launch_name, launch_start_ns)."""
    n = len(g)
    cause = np.full(n, "launch_delay", dtype=object)
    waited = g["launch_name"].astype(str).to_numpy(dtype=object).copy()
    if not n:
        return cause, waited
    start, end = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
    launch = g["launch_start_ns"].fillna(0).astype("int64").to_numpy()
    queued = end - launch
    open_ = np.ones(n, bool)  # not yet explained

    def settle(mask: np.ndarray, name: str, what: np.ndarray) -> None:
        sel = open_ & mask
        cause[sel], waited[sel] = name, what[sel]
        open_[sel] = False

    ranks = g["rank_key"].to_numpy()
    host = np.zeros(n, bool)
    sync_names = np.full(n, "", dtype=object)
    for rank in np.unique(ranks):
        on = ranks == rank
        syncs = host_syncs(df, int(rank), sync_call)
        if not len(syncs):
            continue
        cov = union(syncs["start_ns"].to_numpy(), syncs["end_ns"].to_numpy()).coverage()
        covered = cov.between(start[on], end[on]) / np.maximum(end[on] - start[on], 1)
        host[on] = covered >= busy_fraction
        sync_names[on] = sync_name_at(syncs, start[on], end[on])
    sync_names[host & (sync_names == "")] = "a synchronisation"
    # A host sync or a collective explains only an idle GPU longer than a launch takes:
    # a few µs between queued kernels are kernel-to-kernel overhead whatever the host does.
    long = g["dur_ns"].to_numpy(np.int64) > PLAUSIBLE_LAUNCH_NS
    settle(long & host, "host_wait", sync_names)
    settle(_stream_waited(df, g, launch), "stream_wait", np.full(n, _STREAM_WAIT, dtype=object))
    comm = long & g["next_comm"].to_numpy(bool)
    settle(comm, "peer_wait", g["next_op"].astype(str).to_numpy(dtype=object))
    graph = pattern_mask(g["launch_name"].astype(str).astype("category"), _GRAPH_LAUNCH)
    settle(graph, "graph", waited.copy())
    queued_text = np.full(n, "", dtype=object)
    queued_text[long] = [f"queued {q / 1e6:.2f} ms" for q in queued[long]]
    settle(long, "unexplained", queued_text)
    return cause, waited
