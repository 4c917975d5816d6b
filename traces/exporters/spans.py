"""Spans onto tracks: CPU threads, GPU streams, copy engines, communication.

Where a span goes (its resource), in the order groups are written:
- a CPU thread (`pid`, `tid`) under its process — collectives excepted;
- CPU-side collectives (`comm` without a device) on the process's communication track;
- on a GPU (`device`): kernels on their stream's track, copies and memsets on the
  stream's copy track, collectives on the device's communication track, anything else
  (GPU annotations, syncs) on the stream's "other" track;
- a span with neither on an "unattributed" group, by category.
Within a resource, spans are sorted by (start, -end) and spread over lanes (lanes.py):
lane 0 is the resource's own track, extra lanes are tracks beside it. Rows are read in
bounded chunks: the columns are Arrow/numpy arrays, Python objects exist a chunk at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .flows import StepFlows, span_flows
from .lanes import NestingLanes
from .sink import Sink
from .tracks import Track, TrackTree

if TYPE_CHECKING:
    from ..reader import Run

CHUNK_ROWS = 16384
INT_COLUMNS = [
    "start_ns",
    "dur_ns",
    "pid",
    "tid",
    "device",
    "stream",
    "rank",
    "step_id",
    "correlation",
    "flops",
    "bytes",
]
SPAN_COLUMNS = [*INT_COLUMNS, "name", "category", "args"]
# perfdiag's own fields in each slice's args (where set): device/stream and rank let
# perfdiag's importer read a Chrome export back with its GPU work and ranks.
ARG_COLUMNS = ("step_id", "correlation", "flops", "bytes", "device", "stream", "rank")
COPY_CATEGORIES = ("gpu_memcpy", "gpu_memset")

# resource kinds, in writing order: CPU before GPU (flow ties), then the rest
CPU_THREAD, CPU_COMM, GPU_KERNELS, GPU_COPIES, GPU_OTHER, GPU_COMM, NOWHERE = range(7)


class Names:
    """Process and thread names an importer kept in the manifest (per rank)."""

    def __init__(self, manifest_extra: dict, process_label: str = "process"):
        self.label = process_label  # for a process the manifest does not name
        self.processes: dict[tuple[int, int], str] = {}
        self.threads: dict[tuple[int, int, int], str] = {}
        for f in manifest_extra.get("kineto", {}).get("files", []):
            rank = f.get("rank", -1)
            for pid, p in (f.get("processes") or {}).items():
                if str(pid).lstrip("-").isdigit() and p.get("name"):
                    self.processes[(rank, int(pid))] = p["name"]
            for key, name in (f.get("threads") or {}).items():
                pid, _, tid = str(key).partition("/")
                if pid.lstrip("-").isdigit() and tid.lstrip("-").isdigit():
                    self.threads[(rank, int(pid), int(tid))] = str(name).strip()


class SpanPlan:
    """The spans' columns, resources, writing order and flows, worked out before anything
    is written: the steps pass (written first) needs the step ends of the kernel flows.

    Memory is what a million spans make it matter: each Arrow column is dropped as soon
    as it is converted, and only the numpy arrays the writing needs are kept."""

    def __init__(self, run: Run, steps: dict[tuple, int], step_flows: StepFlows,
                 with_args: bool = True):  # fmt: skip
        table = run.arrow("spans", SPAN_COLUMNS if with_args else SPAN_COLUMNS[:-1])
        self.n = n = table.num_rows
        self.cols = cols = {}
        for c in INT_COLUMNS:
            cols[c] = table[c].fill_null(-1).to_numpy()
            table = table.drop_columns([c])
        cat_dict = pc.dictionary_encode(table["category"]).combine_chunks()
        self.categories = cat_dict.dictionary.to_pylist()
        self.cat_codes = cat_dict.indices.to_numpy(zero_copy_only=False)
        name_dict = pc.dictionary_encode(table["name"]).combine_chunks()
        self.names = name_dict.dictionary.to_pylist()
        self.name_codes = name_dict.indices.to_numpy(zero_copy_only=False)
        self.raw_args = table["args"].combine_chunks() if with_args else None
        del table, cat_dict, name_dict
        kind = _resource_kinds(cols, self.categories, self.cat_codes)
        gpu = kind >= GPU_KERNELS
        a = np.where(gpu, cols["device"], cols["pid"])
        b = np.where(gpu, cols["stream"], cols["tid"])
        b[(kind == GPU_COMM) | (kind == CPU_COMM)] = -1
        b[kind == NOWHERE] = self.cat_codes[kind == NOWHERE]
        cpu_first = gpu.astype(np.int8) + (kind == NOWHERE)
        start, rank = cols["start_ns"], cols["rank"]
        self.order = order = np.lexsort(
            (-(start + cols["dur_ns"]), start, kind, b, a, rank, cpu_first)
        )
        del cpu_first, gpu
        change = np.zeros(n, dtype=bool)
        for key in (rank, a, kind, b):
            k = key[order]
            change[1:] |= k[1:] != k[:-1]
        firsts = np.flatnonzero(change).tolist()
        heads = order[[0, *firsts]] if n else order[:0]
        self.groups = [
            ((int(rank[h]), int(a[h]), int(kind[h]), int(b[h])), lo, hi)
            for h, lo, hi in zip(heads.tolist(), [0, *firsts], [*firsts, n], strict=True)
        ] if n else []  # fmt: skip
        del a, b, kind
        self.flows = span_flows(cols, self.categories, self.cat_codes, steps, step_flows)


def write_spans(plan: SpanPlan, tree: TrackTree, sink: Sink, names: Names) -> dict[str, int]:
    """Write every span; returns slices written per category."""
    counts: dict[str, int] = {}
    for (rank, ra, rk, rb), lo, hi in plan.groups:
        lanes = NestingLanes()
        lane_tracks = [_resource_track(tree, names, rank, ra, rk, rb, plan.categories)]
        for c0 in range(lo, hi, CHUNK_ROWS):
            rows = plan.order[c0 : min(hi, c0 + CHUNK_ROWS)]
            _write_chunk(plan, rows, lanes, lane_tracks, tree, sink, counts)
    return counts


def _write_chunk(
    plan: SpanPlan,
    rows: np.ndarray,
    lanes: NestingLanes,
    lane_tracks: list[Track],
    tree: TrackTree,
    sink: Sink,
    counts: dict[str, int],
) -> None:
    cols = plan.cols
    starts = cols["start_ns"][rows].tolist()
    durs = cols["dur_ns"][rows].tolist()
    lane_of = lanes.assign(starts, (cols["start_ns"][rows] + cols["dur_ns"][rows]).tolist())
    base = lane_tracks[0]
    while len(lane_tracks) < lanes.count:
        k = len(lane_tracks)
        track = tree.child(("lane", base.uuid, k), tree.parent(base), f"{base.name} ({k + 1})")
        lane_tracks.append(track)
    names = [plan.names[i] for i in plan.name_codes[rows].tolist()]
    cats = [plan.categories[i] for i in plan.cat_codes[rows].tolist()]
    arg_cols = [(c, cols[c][rows].tolist()) for c in ARG_COLUMNS]
    raws = plan.raw_args.take(pa.array(rows)).to_pylist() if plan.raw_args is not None else None
    outs, ins = plan.flows.chunk(rows)
    for i, start in enumerate(starts):
        args = [(c, v[i]) for c, v in arg_cols if v[i] >= 0]
        sink.slice(
            lane_tracks[lane_of[i]],
            start,
            durs[i],
            names[i],
            cats[i],
            args,
            raws[i] if raws else None,
            outs[i],
            ins[i],
        )
    for c in cats:
        counts[c] = counts.get(c, 0) + 1


def _resource_kinds(cols, categories: list[str], cat_codes: np.ndarray) -> np.ndarray:
    code = {c: i for i, c in enumerate(categories)}
    is_comm = cat_codes == code.get("comm", -1)
    is_kernel = cat_codes == code.get("kernel", -1)
    is_copy = np.isin(cat_codes, [code[c] for c in COPY_CATEGORIES if c in code])
    on_gpu = cols["device"] >= 0
    on_cpu = ~on_gpu & ((cols["pid"] >= 0) | (cols["tid"] >= 0))
    # A rank's host work with no thread named (tensor-parallel workers' forwards and
    # collectives) goes to that rank's CPU group, a lane per rank, not "unattributed".
    host_work = np.isin(cat_codes, [code[c] for c in ("comm", "python") if c in code])
    on_cpu |= ~on_gpu & (cols["rank"] >= 0) & host_work
    kind = np.full(len(cat_codes), NOWHERE, dtype=np.int64)
    kind[on_cpu] = CPU_THREAD
    kind[on_cpu & is_comm] = CPU_COMM
    kind[on_gpu] = GPU_OTHER
    kind[on_gpu & is_kernel] = GPU_KERNELS
    kind[on_gpu & is_copy] = GPU_COPIES
    kind[on_gpu & is_comm] = GPU_COMM
    return kind


def _rank_label(rank: int) -> str:
    return "" if rank < 0 else f" · rank {rank}"


def _resource_track(
    tree: TrackTree, names: Names, rank: int, a: int, kind: int, b: int, categories: list[str]
) -> Track:
    if kind in (CPU_THREAD, CPU_COMM):
        gkey = ("process", rank, a)
        label = names.processes.get((rank, a)) or names.label
        gname = f"{label} {a}{_rank_label(rank)}" if a >= 0 else f"CPU{_rank_label(rank)}"
        group = tree.group(gkey, gname, os_pid=a if a >= 0 else None)
        if kind == CPU_COMM:
            track = tree.child(("cpu-comm", rank, a), group, "communication")
        else:
            tname = names.threads.get((rank, a, b)) or (f"thread {b}" if b >= 0 else "host")
            track = tree.child(("thread", rank, a, b), group, tname, os_tid=b)
    elif kind == NOWHERE:
        group = tree.group(("unattributed", rank), f"unattributed{_rank_label(rank)}")
        track = tree.child(("nowhere", rank, b), group, categories[b])
    else:
        group = gpu_group(tree, rank, a)
        what = {
            GPU_KERNELS: "stream {}",
            GPU_COPIES: "stream {} · copies",
            GPU_OTHER: "stream {} · other",
            GPU_COMM: "communication",
        }[kind]
        where = what.format(b) if b >= 0 else what.replace("stream {}", "no stream (context-wide)")
        track = tree.child(("gpu", rank, a, kind, b), group, where)
    return track


def gpu_group(tree: TrackTree, rank: int, device: int) -> Track:
    return tree.group(("gpu", rank, device), f"GPU {device}{_rank_label(rank)}")
