"""Engine steps on the scheduler track, and the counters the steps table implies.

A step is a slice named `step N` with its batch composition, queue depths and KV state
as arguments. Counters, sampled at each step's start (the state its forward ran in):
waiting / running / swapped sequences, KV blocks used and cached, swap-tier blocks, and
tokens/s (prefill tokens + decode sequences over the step's duration; back to 0 when the
engine sits idle between steps). The prefix-cache hit rate is cumulative over first
admissions (cached prompt tokens / prompt tokens), as `analyzers/cache.py` defines it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .flows import StepFlows
from .lanes import NestingLanes
from .sink import Sink
from .tracks import COUNTER, Track, TrackTree

ARG_COLUMNS = [
    "num_prefill_seqs",
    "num_prefill_tokens",
    "num_decode_seqs",
    "num_context_tokens",
    "num_waiting",
    "num_running",
    "num_swapped",
    "num_preempted",
    "kv_blocks_used",
    "kv_blocks_free",
    "kv_blocks_cached",
    "kv_cpu_blocks_used",
    "num_cached_tokens",
    "gpu_time_ns",
]
COUNTERS = [  # (column, track name, unit)
    ("num_waiting", "waiting requests", "requests"),
    ("num_running", "running sequences", "sequences"),
    ("num_swapped", "swapped sequences", "sequences"),
    ("kv_blocks_used", "KV blocks used", "blocks"),
    ("kv_blocks_cached", "KV blocks cached (prefix cache)", "blocks"),
    ("kv_cpu_blocks_used", "KV blocks on CPU (swap)", "blocks"),
]


def scheduler_group(tree: TrackTree, rank: int, replica: int = -1) -> Track:
    """One per rank; a data-parallel run's replicas (each its own engine) one each."""
    name = "Scheduler" + ("" if rank < 0 else f" · rank {rank}")
    if replica < 0:
        return tree.group(("scheduler", rank), name)
    return tree.group(("scheduler", rank, "replica", replica), f"{name} · replica {replica}")


def step_starts(steps: pa.Table) -> dict[tuple[int, int], int]:
    """(rank, step_id) → start_ns; rank -1 when null."""
    if steps.num_rows == 0:
        return {}
    ranks = steps["rank"].fill_null(-1).to_pylist()
    keys = zip(ranks, steps["step_id"].to_pylist(), strict=True)
    return dict(zip(keys, steps["start_ns"].to_pylist(), strict=True))


def write_steps(
    steps: pa.Table, tree: TrackTree, sink: Sink, flows: StepFlows, request_rank: int
) -> tuple[int, int]:
    """Slices and counters per rank (and per data-parallel replica: their steps overlap);
    request flows attach to `request_rank`'s steps. Returns (slices, counter samples)."""
    if steps.num_rows == 0:
        return 0, 0
    ranks = steps["rank"].fill_null(-1).to_numpy()
    replicas = np.full(len(ranks), -1)
    if "replica" in steps.column_names:
        replicas = steps["replica"].fill_null(-1).to_numpy()
    start, end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    written = samples = 0
    for rank, replica in sorted(set(zip(ranks.tolist(), replicas.tolist(), strict=True))):
        rows = np.flatnonzero((ranks == rank) & (replicas == replica))
        rows = rows[np.lexsort((-end[rows], start[rows]))]
        t = steps.take(pa.array(rows))
        group = scheduler_group(tree, rank, replica)
        key = ("steps", rank) if replica < 0 else ("steps", rank, "replica", replica)
        base = tree.child(key, group, "steps")
        lane_tracks, lanes = [base], NestingLanes()
        s, e = t["start_ns"].to_pylist(), t["end_ns"].to_pylist()
        ids = t["step_id"].to_pylist()
        cols = [(c, t[c].to_pylist()) for c in ARG_COLUMNS if c in t.column_names]
        lane_of = lanes.assign(s, e)
        while len(lane_tracks) < lanes.count:
            lane_tracks.append(
                tree.child((*key, len(lane_tracks)), group, f"steps ({len(lane_tracks) + 1})")
            )
        for i, sid in enumerate(ids):
            args = [("step_id", sid)] + [(c, v[i]) for c, v in cols if v[i] is not None]
            key = (rank, sid)
            outs = flows.out.get(key, [])
            ins = flows.into.get(key, [])
            if rank == request_rank:
                outs = outs + flows.out.get(("request", sid), [])
                ins = ins + flows.into.get(("request", sid), [])
            sink.slice(
                lane_tracks[lane_of[i]],
                s[i],
                e[i] - s[i],
                f"step {sid}",
                "step",
                args,
                None,
                outs,
                ins,
            )
        written += len(ids)
        samples += _step_counters(t, tree, group, sink)
    return written, samples


def _step_counters(t: pa.Table, tree: TrackTree, group: Track, sink: Sink) -> int:
    s = t["start_ns"].to_pylist()  # sorted by start
    n = 0
    for col, name, unit in COUNTERS:
        values = t[col].to_pylist()
        if all(v is None for v in values) or (
            col.startswith(("num_swapped", "kv_cpu")) and not any(values)
        ):
            continue
        track = tree.child((group.uuid, col), group, name, COUNTER, unit=unit)
        for ts, v in zip(s, values, strict=True):
            if v is not None:
                sink.counter(track, ts, float(v))
                n += 1
    # tokens/s during each step, 0 in the gaps between steps
    e = t["end_ns"].to_pylist()
    tokens = pc.add(t["num_prefill_tokens"], t["num_decode_seqs"]).to_pylist()
    track = tree.child(
        (group.uuid, "tokens/s"), group, "tokens/s (processed)", COUNTER, unit="tokens/s"
    )
    for i, ts in enumerate(s):
        sink.counter(track, ts, tokens[i] * 1e9 / (e[i] - ts) if e[i] > ts else 0.0)
        n += 1
        if i + 1 == len(s) or s[i + 1] > e[i]:  # idle until the next step starts
            sink.counter(track, e[i], 0.0)
            n += 1
    return n


def write_hit_rate(
    events: pa.Table, requests: pa.Table, tree: TrackTree, sink: Sink, rank: int
) -> int:
    """Cumulative prefix-cache hit rate at each request's first admission, in %.
    Returns the samples written."""
    if events.num_rows == 0 or requests.num_rows == 0:
        return 0
    sched = events.filter(pc.equal(events["kind"], "scheduled"))
    if sched.num_rows == 0 or "num_cached_tokens" not in sched.column_names:
        return 0
    sched = sched.take(pc.sort_indices(sched, [("ts_ns", "ascending")]))
    prompt = dict(
        zip(requests["request_id"].to_pylist(), requests["prompt_tokens"].to_pylist(), strict=True)
    )
    seen: set[str] = set()
    hits = total = n = 0
    track = None
    for rid, ts, cached in zip(
        sched["request_id"].to_pylist(),
        sched["ts_ns"].to_pylist(),
        sched["num_cached_tokens"].to_pylist(),
        strict=True,
    ):
        if rid in seen or not prompt.get(rid):
            continue
        seen.add(rid)
        hits += cached or 0
        total += prompt[rid]
        if track is None:
            group = scheduler_group(tree, rank)
            track = tree.child(
                (group.uuid, "hit-rate"), group, "prefix-cache hit rate", COUNTER, unit="%"
            )
        sink.counter(track, ts, 100.0 * hits / total)
        n += 1
    return n
