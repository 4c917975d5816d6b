"""`import_with_ray(paths, out)`: many rank traces imported by Ray tasks, one per file.

Each task imports one file with the serial importer (`import_kineto`, one file, one
process) into a run part of its own, `PARTS_DIR/rank-N`, a complete run that the driver
must be able to read: a local directory for a local cluster, a shared filesystem path
for a real one (the trace files too). The task may also summarise its part (`per_rank`,
a function run in the task: the caller's analysis; traces/ imports no analyzer), so that
only small summaries, not spans, travel back.

The driver then merges the parts into one run, in the files' order, with exactly the
rows the serial import of the same files writes: ranks are assigned by the same rule
(kineto_identity.assign_ranks, on identities read by tasks too) and every part's times
are shifted from its own file's time base onto the first file's (the serial import
shifts while reading; here the whole part's column moves by the same integer ns).

A task that fails (its file is malformed, its worker dies, it is cancelled) leaves its
rank out: the run keeps every other rank and names the missing ones in the manifest
(`parts_missing`: rank, file, reason), which the quality gate reports. Only when every
rank fails does the import fail.

Ray is imported here only, and only when this runs: without `--ray`, nothing imports it.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import ConfigError, PerfdiagError
from ...ray_reach import unreachable
from ..layout import RAW_DIR
from ..manifest import CRASHED
from ..reader import load_run
from ..schema import ROW_TYPES
from ..writer import RunWriter
from .kineto import RECORDED_BY, FileSummary, ImportSummary, import_kineto
from .kineto_identity import assign_ranks, read_identity

# Fault injection for tests: a task whose file has this name kills its worker process
# (as an OOM kill or a segfault in a native reader would), passed to the workers.
KILL_ENV = "PERFDIAG_RAY_IMPORT_KILL"
TIME_COLUMNS = {"spans": "start_ns", "counters": "ts_ns"}  # what a time base shift moves


@dataclass
class RayImportSummary(ImportSummary):
    address: str | None = None  # the cluster's address (None: a local one started here)
    parts_dir: Path | None = None
    nodes: int = 0  # nodes the tasks ran on
    missing: list[dict] = field(default_factory=list)  # {rank, path, reason}
    per_rank: list[Any] = field(default_factory=list)  # what `per_rank` returned, file order
    task_seconds: float = 0.0  # the tasks' own import time, summed
    merge_seconds: float = 0.0  # the driver's merge of the parts into the run


def import_with_ray(
    paths: list[Path],
    out: Path,
    *,
    address: str | None = None,
    parts_dir: Path | None = None,
    command: list[str] | None = None,
    copy_raw: bool = False,
    ranks: list[int] | None = None,
    per_rank: Callable[[Path, int], Any] | None = None,
) -> RayImportSummary:
    """Import `paths` (one file per rank) into the run `out` with one Ray task per file.
    `address`: a running cluster (None or "local": start one here, `ray.init()`);
    `parts_dir`: where the parts go (kept; None: beside `out`, removed after the merge);
    `per_rank(part_dir, offset_ns)`: run in each task on its part (times to be shifted by
    offset_ns onto the merged run's base); its results come back in `per_rank`."""
    t0 = time.perf_counter()
    files = [Path(p) for p in paths]
    if not files:
        raise ConfigError("no trace files to import")
    for p in files:
        if not p.is_file():
            raise ConfigError(f"{p}: no such trace file")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: already exists and is not an empty directory")
    keep_parts = parts_dir is not None
    parts = Path(parts_dir) if keep_parts else out.parent / f".{out.name}.parts-{os.getpid()}"
    ray, started = _connect(address)
    try:
        identity = ray.remote(num_cpus=1)(_identity)
        ids = _gather(ray, [identity.remote(str(p.resolve()), len(files) > 1)
                            for p in files])  # fmt: skip
        failed = [(f, e) for f, e in zip(files, ids, strict=True) if isinstance(e, Exception)]
        if failed:  # nothing imported yet: a file nobody can read is the user's to fix
            raise ConfigError(f"{failed[0][0]}: {_reason(failed[0][1])}")
        warnings = assign_ranks(ids, ranks)
        bases = [i.base_time_ns or 0 for i in ids]
        offsets = [b - bases[0] for b in bases] if len(files) > 1 else [0]
        part_dirs = [parts / (f"rank-{i.rank}" if i.rank is not None else "part-0") for i in ids]
        taken = [d for d in part_dirs if d.exists()]
        if taken:
            raise ConfigError(f"{taken[0]}: a run part is already there (an empty --parts-dir)")
        parts.mkdir(parents=True, exist_ok=True)
        task = ray.remote(num_cpus=1, max_retries=1)(_import_part)
        env = {KILL_ENV: os.environ[KILL_ENV]} if os.environ.get(KILL_ENV) else None
        if env:
            task = task.options(runtime_env={"env_vars": env})
        refs = [
            task.remote(
                str(p.resolve()), str(d.resolve()), _rank_override(i), off, command, per_rank
            )
            for p, d, i, off in zip(files, part_dirs, ids, offsets, strict=True)
        ]
        results = _gather(ray, refs)
        summary = RayImportSummary(
            out=out, address=address, parts_dir=parts if keep_parts else None
        )
        summary.warnings = list(warnings)
        done = []
        for p, i, d, off, res in zip(files, ids, part_dirs, offsets, results, strict=True):
            if isinstance(res, Exception):
                summary.missing.append({"rank": i.rank, "path": str(p), "reason": _reason(res)})
                continue
            res["file"].rank_source = i.rank_source
            done.append((p, i, d, off, res))
        if not done:
            m = summary.missing[0]
            raise PerfdiagError(f"no rank could be imported: {m['path']}: {m['reason']}")
        for m in summary.missing:
            summary.warnings.append(f"rank {m['rank']} ({Path(m['path']).name}) is missing from "
                                    f"the run: {m['reason']}")  # fmt: skip
        t_merge = time.perf_counter()
        _merge(done, files, out, bases, command, copy_raw, summary)
        summary.merge_seconds = time.perf_counter() - t_merge
        summary.nodes = len({res["node"] for *_, res in done})
        summary.task_seconds = sum(res["seconds"] for *_, res in done)
        summary.per_rank = [res["per_rank"] for *_, res in done]
        summary.seconds = time.perf_counter() - t0
        return summary
    finally:
        if not keep_parts:
            shutil.rmtree(parts, ignore_errors=True)
        if started:
            ray.shutdown()


def _connect(address: str | None):
    """`ray` connected to `address` (None / "local": a local cluster started here); and
    whether this call started it (then it is shut down at the end)."""
    import logging

    import ray

    if ray.is_initialized():
        return ray, False
    local = address in (None, "", "local")
    if not local and (e := unreachable(address)) is not None:
        raise ConfigError(f"--ray-address {address}: nothing answers there ({e})")
    try:
        ray.init(address=None if local else address, include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=False)  # fmt: skip
    except (ConnectionError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = "start a local Ray cluster" if local else f"connect to Ray at {address}"
        raise ConfigError(f"--ray: cannot {where} ({first})") from None
    return ray, True


def _gather(ray, refs: list) -> list:
    """Each task's result, or the exception it ended with (in the tasks' order)."""
    out: list = [None] * len(refs)
    index = {r: k for k, r in enumerate(refs)}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                try:
                    out[index[r]] = ray.get(r)
                except ray.exceptions.RayError as e:
                    out[index[r]] = e
    except BaseException:  # Ctrl-C: the tasks still running are stopped, not orphaned
        for r in pending:
            ray.cancel(r, force=True)
        raise
    return out


def _reason(e: Exception) -> str:
    """One line saying why a task failed (a task's own error: its message)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, Exception):
        e = cause
    name = type(e).__name__
    if "WorkerCrashed" in name or "ActorDied" in name or "NodeDied" in name:
        return "its Ray worker died while importing it"
    if "Cancelled" in name:
        return "its Ray task was cancelled"
    text = str(e).strip().splitlines()
    return (text[0] if text else name)[:300]


def _rank_override(ident) -> int | None:
    """The rank to give the one-file import: only where the file does not say it (the
    serial import's --rank or position rule), so the part warns as the serial one does."""
    return None if ident.rank_source == "distributedInfo" else ident.rank


def _identity(path: str, need_base: bool):
    return read_identity(Path(path), need_base=need_base)


def _import_part(path: str, part_dir: str, rank, offset_ns: int, command, per_rank) -> dict:
    """The task: one file into its part, then the caller's per-rank summary of it."""
    if os.environ.get(KILL_ENV) == Path(path).name:
        os._exit(1)  # the fault a test injects: this worker dies
    t0 = time.perf_counter()
    s = import_kineto([path], part_dir, command=command, jobs=1,
                      ranks=None if rank is None else [rank])  # fmt: skip
    manifest = load_run(part_dir).manifest
    summary = per_rank(Path(part_dir), offset_ns) if per_rank is not None else None
    return {
        "file": s.files[0],
        "warnings": s.warnings,
        "manifest": manifest,
        "per_rank": summary,
        "seconds": time.perf_counter() - t0,
        "node": _node_id(),
    }


def _node_id() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # called outside a task: this host is the node
        return socket.gethostname()


def _merge(done, files, out: Path, bases, command, copy_raw: bool, summary: RayImportSummary):
    """The parts' rows, shifted onto the first file's time base, into the run `out`."""
    tmp = out.parent / f".{out.name}.importing-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    writer = RunWriter(
        tmp,
        command=command,
        config={"importer": "kineto", "traces": [str(p.resolve()) for p in files]},
        source="kineto",
        environment_info={"recorded_by": RECORDED_BY},
        batch_rows=1 << 17,
    )
    try:
        metas = []
        for path, ident, part_dir, offset, res in done:
            part = load_run(part_dir)
            for name in ROW_TYPES:
                table = part.arrow(name)
                if table.num_rows:
                    for batch in _shifted(table, TIME_COLUMNS.get(name), offset).to_batches():
                        writer.table(name).append_batch(batch)
            fs: FileSummary = res["file"]
            summary.files.append(fs)
            summary.warnings += [w for w in res["warnings"] if w not in summary.warnings]
            meta = dict(res["manifest"].extra["kineto"]["files"][0])
            meta["rank_source"] = ident.rank_source
            meta["profiler_windows"] = [
                [a + offset, b + offset] for a, b in meta["profiler_windows"]
            ]
            metas.append(meta)
            if copy_raw:
                (tmp / RAW_DIR).mkdir(exist_ok=True)
                shutil.copy2(path, tmp / RAW_DIR / Path(path).name)
        first = done[0][4]["manifest"]
        clock = dict(first.clock)
        clock["wall_ns"] = int(clock["wall_ns"]) - (bases[files.index(done[0][0])] - bases[0])
        writer.update_manifest(
            environment=first.environment,
            clock=clock,
            extra={
                **writer.manifest.extra,
                "kineto": {"files": metas, "warnings": summary.warnings},
                "ray": {
                    "address": summary.address or "local",
                    "tasks": len(files),
                    "parts_dir": str(summary.parts_dir) if summary.parts_dir else None,
                },
                "parts_missing": [{"part": f"rank {m['rank']}", **m} for m in summary.missing],
            },
        )
        writer.close()
        if writer.failure is not None:
            raise writer.failure_error()
    except BaseException:
        writer.close(CRASHED)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.rename(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PerfdiagError(f"{out}: cannot move the imported run into place ({e})") from None


def _shifted(table: pa.Table, column: str | None, offset: int) -> pa.Table:
    if not offset or column is None:
        return table
    i = table.schema.get_field_index(column)
    return table.set_column(i, column, pc.add(table.column(column), pa.scalar(offset, pa.int64())))
