"""TensorBoard: a log directory the torch-tb-profiler plugin opens.

The plugin reads `<logdir>/<run>/<worker>[.<n>].pt.trace.json[.gz]`: Kineto's Chrome-JSON
trace, one file per worker. Two sources, in this order of preference (`source="auto"`):
- `raw`: the profiler traces kept in the run's `raw/` folder (`perfdiag run
  --profile-steps` keeps one; `perfdiag import --copy-raw` copies the originals), copied
  byte for byte — the plugin's native input, with its own clock;
- `run`: the profiler spans of the run rewritten in Kineto's layout, one file per rank:
  CPU ops, Python functions, annotations, runtime calls on their threads (pid, tid);
  kernels, copies, memsets and GPU collectives on `pid` = device, `tid` = stream, with
  the args the plugin reads (`device`, `stream`, `correlation`, `External id`) and `ac2g`
  flows from launch to GPU op. perfdiag's own phases and probes are left out (they are
  not profiler events and would cross the ops on their thread).
A run with neither has no profiler window: that is an error, not an empty log dir.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..layout import RAW_DIR
from ..reader import Run
from .chrome import ChromeSink
from .identity import device_properties as device_properties  # re-exported
from .identity import kineto_header
from .output import ExportError, atomic_dir
from .sink import FLOW_LAUNCH, TraceInfo, flow_id
from .tracks import SLICES, TrackTree

PROFILER_CATEGORIES = (
    "cpu_op",
    "python",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "comm",
    "annotation",
    "cuda_sync",
)
WINDOW_CATEGORIES = (
    "cpu_op",
    "python",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
)  # what only a profiler records
CHUNK_ROWS = 16384
SYNTHETIC_EXTERNAL_ID = 1 << 48
COLUMNS = [
    "name",
    "category",
    "start_ns",
    "dur_ns",
    "pid",
    "tid",
    "device",
    "stream",
    "rank",
    "correlation",
    "args",
]
_RAW = re.compile(r"\.json(\.gz)?$")


def raw_traces(run: Run) -> list[Path]:
    folder = Path(run.path) / RAW_DIR
    return sorted(p for p in folder.glob("*") if p.is_file() and _RAW.search(p.name))


def export_tensorboard(run: Run, logdir: Path, source: str = "auto"):
    from . import ExportResult

    if source not in ("auto", "raw", "run"):
        raise ExportError(f"unknown TensorBoard source {source!r}; choose auto, raw or run")
    raws = raw_traces(run) if source != "run" else []
    spans = run.arrow("spans", ["category"])
    has_window = bool(
        pc.any(pc.is_in(spans["category"].cast(pa.string()), pa.array(WINDOW_CATEGORIES))).as_py()
    )
    if not raws and (source == "raw" or not has_window):
        raise ExportError(
            f"{run.path} has no profiler window: TensorBoard's profiler plugin needs one "
            "(record with `perfdiag run --profile-steps A:B`, or import a profiler trace)"
        )
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.manifest.run_id) or "run"
    target = Path(logdir) / name
    with atomic_dir(target) as tmp:
        files = [_copy_raw(p, tmp) for p in raws] if raws else _write_kineto(run, tmp)
    files = [target / f.name for f in files]
    result = ExportResult("tensorboard", Path(logdir), files=files)
    result.bytes = sum(f.stat().st_size for f in files)
    if not raws:
        result.slices = _count(run)
    return result


def _copy_raw(path: Path, folder: Path) -> Path:
    stem = _RAW.sub("", path.name)
    worker = re.sub(r"[^A-Za-z0-9_-]+", "_", stem) or "worker"
    dest = folder / f"{worker}.pt.trace.json{'.gz' if path.name.endswith('.gz') else ''}"
    try:
        shutil.copyfile(path, dest)
    except OSError as e:
        raise ExportError(f"cannot copy {path}: {e.strerror or e}") from None
    return dest


def _profiler_rows(run: Run) -> pa.Table:
    """Profiler spans that sit on a thread or a GPU queue (Kineto has no other place)."""
    t = run.arrow("spans", COLUMNS)
    placed = pc.or_(pc.is_valid(t["device"]), pc.is_valid(t["tid"]))
    wanted = pc.is_in(t["category"].cast(pa.string()), pa.array(PROFILER_CATEGORIES))
    return t.filter(pc.and_(wanted, placed))


def _count(run: Run) -> dict[str, int]:
    cats = _profiler_rows(run)["category"].cast(pa.string())
    return {r["values"]: r["counts"] for r in pc.value_counts(cats).to_pylist()}


def _write_kineto(run: Run, folder: Path) -> list[Path]:
    t = _profiler_rows(run)
    ranks = t["rank"].fill_null(-1).to_numpy()
    host = str(run.manifest.writer.get("host") or "perfdiag")
    files = []
    for rank in np.unique(ranks).tolist():
        rows = t.filter(pa.array(ranks == rank))
        worker = (
            f"{host}_rank{rank}" if rank >= 0 else f"{host}_{run.manifest.writer.get('pid', 0)}"
        )
        path = folder / f"{re.sub(r'[^A-Za-z0-9_-]+', '_', worker)}.pt.trace.json"
        header = {"schemaVersion": 1, "deviceProperties": []}
        header.update(kineto_header(run, rank if rank >= 0 else None))
        if rank >= 0 and "distributedInfo" not in header:  # a recorded run: its own ranks
            world = len(np.unique(ranks[ranks >= 0]))
            header["distributedInfo"] = {"rank": rank, "world_size": world}
        with open(path, "w", encoding="utf-8") as f:
            _write_rank(rows, ChromeSink(f, extra_header=header), run)
        files.append(path)
    return files


def _write_rank(t: pa.Table, sink: ChromeSink, run: Run) -> None:
    first = pc.min(t["start_ns"]).as_py() if t.num_rows else 0
    sink.begin(TraceInfo(run.manifest.run_id, run.manifest.source, first, None, None))
    tree = TrackTree(sink.declare)
    order = pc.sort_indices(t, [("start_ns", "ascending")])
    t = t.take(order)
    launches: dict[int, int] = {}  # correlation -> the launch's start (first launch wins)
    for lo in range(0, t.num_rows, CHUNK_ROWS):
        c = t.slice(lo, CHUNK_ROWS)
        cols = {k: c[k].to_pylist() for k in COLUMNS}
        for i in range(c.num_rows):
            _write_span(cols, i, lo + i, tree, sink, launches)
    sink.close()


def _write_span(cols, i, row, tree, sink, launches) -> None:
    cat, dev, stream = cols["category"][i], cols["device"][i], cols["stream"][i]
    corr = cols["correlation"][i]
    # The plugin keys ops, launches and GPU ops by "External id" (a missing one makes
    # every GPU op look like a collective's): the correlation id where there is one,
    # else a unique id above any tracer's. Recorded args that have one win.
    linked = corr is not None and (dev is not None or cat in ("cuda_runtime", "cuda_driver"))
    args = [("External id", corr if linked else SYNTHETIC_EXTERNAL_ID + row)]
    if corr is not None:
        args.append(("correlation", corr))
    flows_out, flows_in = (), ()
    if dev is not None:
        group = tree.group(("gpu", dev), f"GPU {dev}", os_pid=dev)
        track = tree.child(("gpu", dev, stream), group, f"stream {stream}", SLICES, os_tid=stream)
        args += [("device", dev), ("stream", stream if stream is not None else 0)]
        kineto_cat = {"comm": "kernel", "annotation": "gpu_user_annotation"}.get(cat, cat)
        if corr is not None and corr in launches:
            flows_in = (flow_id(FLOW_LAUNCH, corr),)
    else:
        pid, tid = cols["pid"][i], cols["tid"][i]
        group = tree.group(("cpu", pid), f"process {pid}", os_pid=pid)
        track = tree.child(("cpu", pid, tid), group, f"thread {tid}", SLICES, os_tid=tid)
        kineto_cat = {
            "annotation": "user_annotation",
            "python": "python_function",
            "comm": "cpu_op",
            "cuda_driver": "cuda_runtime",
        }.get(cat, cat)
        if cat in ("cuda_runtime", "cuda_driver") and corr is not None and corr not in launches:
            launches[corr] = cols["start_ns"][i]
            flows_out = (flow_id(FLOW_LAUNCH, corr),)
    sink.slice(
        track,
        cols["start_ns"][i],
        cols["dur_ns"][i],
        cols["name"][i],
        kineto_cat,
        args,
        cols["args"][i],
        flows_out,
        flows_in,
    )
