"""`import_kineto(paths, out)`: PyTorch-profiler (Kineto) traces → one perfdiag run.

Several files of one job (one per rank) become one run with a `rank` column. The run is
written into a hidden sibling directory and renamed into place only once complete, so
an import that fails (a malformed or truncated file, Ctrl-C) leaves no run behind that
could be taken for a complete one.

Identity: each file's rank comes from its `distributedInfo` wherever it stands in the
file (or `ranks`, the CLI's `--rank`), read before any row is written; two files of one
rank are refused, and files that disagree on world size or device, or start hours
apart, are imported with warnings (kineto_identity.py).

Time: Kineto's `ts` is µs relative to the file's `baseTimeNanoseconds` (Unix ns; absent
in older traces, whose `ts` are Unix µs). Spans keep the first file's time base; other
files are shifted onto it, and the manifest's clock maps that base to wall time.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError, PerfdiagError
from ..arrow_memory import release_freed_memory
from ..layout import RAW_DIR
from ..manifest import CRASHED
from ..writer import RunWriter
from .chrome_stream import ChromeTraceStream, TraceFormatError
from .kineto_duplicates import IdenticalSpans, identical_warning
from .kineto_events import FastReadFailed, KinetoFileReader
from .kineto_identity import assign_ranks, is_perfdiag_export, late_identity, read_identity
from .kineto_parallel import ParallelReadFailed, is_object_document, plan_workers, read_parallel
from .kineto_split import Helper, SplitRead, SplitReadFailed, plan_split

RECORDED_BY = "pytorch-profiler (kineto)"


@dataclass
class FileSummary:
    path: str
    rank: int | None
    events: int
    spans: dict[str, int]
    skipped: dict[str, int]
    base_time_ns: int
    flows_linked: int
    rank_source: str = "none"  # distributedInfo | --rank | position | none


@dataclass
class ImportSummary:
    out: Path
    files: list[FileSummary] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(f.events for f in self.files)

    @property
    def spans(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for f in self.files:
            for k, v in f.spans.items():
                total[k] = total.get(k, 0) + v
        return total


def _gpus(device_properties) -> list[dict]:
    gpus = []
    if not isinstance(device_properties, list):
        return gpus  # not Kineto's list of devices: none recorded
    for p in device_properties:
        if not isinstance(p, dict):
            continue
        gpus.append(
            {
                "index": p.get("id"),
                "name": None if p.get("name") is None else str(p.get("name")),
                "memory_bytes": p.get("totalGlobalMem"),
                "sm_count": p.get("numSms"),
                "capability": f"{p.get('computeMajor')}.{p.get('computeMinor')}",
                "properties": {k: v for k, v in p.items() if isinstance(v, (int, str))},
            }
        )
    return gpus


def _environment(headers: list[dict]) -> dict:
    """What the trace says about the machine that recorded it (first file's view)."""
    h = headers[0] if headers else {}
    env: dict = {"recorded_by": RECORDED_BY, "gpus": _gpus(h.get("deviceProperties"))}
    for key, name in (
        ("host_name", "hostname"),
        ("cuda_runtime_version", "cuda_runtime"),
        ("cuda_driver_version", "cuda_driver"),
        ("cupti_version", "cupti"),
    ):
        if key in h and h[key] is not None:
            env[name] = str(h[key]) if name == "hostname" else h[key]  # a host is a name
    return env


def import_kineto(
    paths: list[str | os.PathLike],
    out: str | os.PathLike,
    *,
    command: list[str] | None = None,
    copy_raw: bool = False,
    jobs: int | None = None,
    ranks: list[int] | None = None,
    fast: bool = True,
) -> ImportSummary:
    """Import Kineto Chrome-JSON traces (plain or gzipped) into the run directory `out`.
    `fast`: decode with the native front end first (see kineto_fast.py); False, or a
    file it cannot read: the exact one, whose large files are read by `jobs` processes
    (None: up to the CPU count; 1: one process).
    `ranks`: each file's rank, overriding its distributedInfo (one per file)."""
    if not paths:
        raise ConfigError("no trace files to import")
    files = [Path(p) for p in paths]
    for p in files:
        if not p.is_file():
            raise ConfigError(f"{p}: no such trace file")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: already exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.importing-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    t0 = time.perf_counter()
    # Who each file is, before anything is written; several files: each base time too,
    # so all go onto the first file's time base.
    ids = [read_identity(p, need_base=len(files) > 1) for p in files]
    warnings = assign_ranks(ids, ranks)
    bases = [i.base_time_ns or 0 for i in ids] if len(files) > 1 else [None]
    # The fast front end first (a large file's tail read by a helper process); a file it
    # cannot read is read again by the exact one (in parallel when large); a split or
    # parallel read that cannot be trusted is done again by one process.
    mode = ("fast" if fast else "exact", jobs)
    # Started before the run's writer, whose thread would rule out forking it.
    helper = Helper() if fast and any(plan_split(p, jobs) for p in files) else None
    try:
        while True:
            try:
                summary = _write_run(files, ids, tmp, bases, command, copy_raw, mode, warnings,
                                     helper if mode == ("fast", jobs) else None)  # fmt: skip
            except SplitReadFailed:
                mode = ("fast", 1)
                continue
            except FastReadFailed:
                mode = ("exact", jobs)
                continue
            except ParallelReadFailed:
                mode = ("exact", 1)
                continue
            except _LateIdentity as late:  # the file's tail said who it is: read it again
                ids[late.index] = late.identity
                warnings = assign_ranks(ids, ranks)
                continue
            break
    finally:
        if helper is not None:
            helper.close()
    release_freed_memory()  # the decoded events: the analysis that follows starts lower
    try:
        os.rename(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PerfdiagError(f"{out}: cannot move the imported run into place ({e})") from None
    summary.out = out
    summary.seconds = time.perf_counter() - t0
    return summary


def _write_run(files, ids, tmp: Path, bases, command, copy_raw: bool, mode, warnings, helper):
    writer = RunWriter(
        tmp,
        command=command,
        config={"importer": "kineto", "traces": [str(p.resolve()) for p in files]},
        source="kineto",
        environment_info={"recorded_by": RECORDED_BY},
        batch_rows=1 << 17,
    )
    summary = ImportSummary(out=tmp, warnings=list(warnings))
    try:
        headers, file_meta = [], []
        spans, counters = writer.table("spans"), writer.table("counters")
        for i, path in enumerate(files):
            offset = 0 if bases[0] is None else bases[i] - bases[0]
            counted = IdenticalSpans(spans)
            fs, header, meta = _read_file(path, ids[i], offset, counted, counters, mode, tmp,
                                          helper)  # fmt: skip
            meta["identical_spans"] = identical = counted.finish()
            if identical:
                summary.warnings.append(identical_warning(path, identical))
            if (late := late_identity(ids[i], header)) is not None:
                raise _LateIdentity(i, late)
            if bases[0] is not None and fs.base_time_ns != bases[i]:
                raise TraceFormatError(f"{path}: baseTimeNanoseconds changed while reading")
            headers.append(header)
            summary.files.append(fs)
            file_meta.append(meta)
        if copy_raw:
            (tmp / RAW_DIR).mkdir(exist_ok=True)
            for p in files:
                shutil.copy2(p, tmp / RAW_DIR / p.name)
        writer.update_manifest(
            environment=_environment(headers),
            clock={
                "clock": "kineto",  # ns since the trace's time base
                "monotonic_ns": 0,
                "wall_ns": _wall_at_base(headers[0], summary.files[0].base_time_ns),
                "uncertainty_ns": 0,
                "resolution_ns": 1,
            },
            extra={
                **writer.manifest.extra,
                "kineto": {"files": file_meta, "warnings": summary.warnings},
            },
        )
        writer.close()
        if writer.failure is not None:  # a full disk: the import is incomplete, not a run
            raise writer.failure_error()
    except BaseException:
        writer.close(CRASHED)  # never complete-looking, then gone
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _header_before_events(path: Path) -> dict:
    """The top-level keys written before `traceEvents` (device properties, rank)."""
    stream = ChromeTraceStream(path)
    events = stream.events()
    next(events, None)
    events.close()
    return stream.header


def _wall_at_base(header: dict, base_ns: int) -> int:
    """Unix ns at the time base: the base itself (Kineto's is Unix ns), except in a
    perfdiag export, whose base is on the run's own clock and which says its wall time."""
    wall = (
        header.get("otherData", {}).get("wall_ns_at_base") if is_perfdiag_export(header) else None
    )
    return wall if isinstance(wall, int) and not isinstance(wall, bool) else base_ns


class _LateIdentity(Exception):
    """A file's tail changed its identity (see kineto_identity.late_identity)."""

    def __init__(self, index: int, identity):
        super().__init__(index)
        self.index, self.identity = index, identity


def _read_file(path: Path, ident, offset: int, spans, counters, mode, scratch: Path, helper):
    """One file's rows into the tables; `mode`: (front end, parallel jobs); `helper`:
    the process that may read a large file's tail (see kineto_split.py), or None."""
    front_end, jobs = mode
    rank = ident.rank
    export = is_perfdiag_export(ident.header)
    flags = {"perfdiag_export": export, "rank_from_args": export and ident.rank_source != "--rank"}
    workers = 1 if front_end == "fast" else plan_workers(path, jobs)
    if workers > 1 and is_object_document(path):
        header = _header_before_events(path)
        parts = read_parallel(
            path,
            workers,
            rank=rank,
            offset=offset,
            add_spans=spans.append_batch,
            add_counters=counters.append_batch,
            flags=flags,
        )
        header = {**header, **parts[-1].header}
        merged: dict = {"spans": {}, "skipped": {}, "processes": {}, "threads": {}, "windows": []}
        for part in parts:
            for key, value in (("spans", part.spans_by_category), ("skipped", part.skipped)):
                for k, v in value.items():
                    merged[key][k] = merged[key].get(k, 0) + v
            merged["processes"].update(part.processes)
            merged["threads"].update(part.threads)
            merged["windows"] += part.profiler_windows
        events = sum(p.events for p in parts)
        fs = FileSummary(
            str(path),
            rank,
            events,
            merged["spans"],
            merged["skipped"],
            _base_time(header, path),
            0,
            ident.rank_source,
        )
        extra = {
            "processes": merged["processes"],
            "threads": merged["threads"],
            "profiler_windows": merged["windows"],
            "workers": workers,
            "front_end": "exact",
        }
        return fs, header, _file_meta(path, fs, extra, header)
    split = None
    if helper is not None and plan_split(path, jobs) and is_object_document(path):
        split = SplitRead(helper, path, rank=rank, offset=offset, flags=flags,
                          scratch=scratch / ".split", add_spans=spans.append_batch,
                          add_counters=counters.append_batch)  # fmt: skip
    reader = KinetoFileReader(
        path,
        spans.append,
        counters.append,
        rank_of=lambda _h: rank,
        time_offset_ns=offset,
        add_spans=spans.append_batch,
        **flags,
    )
    try:
        reader.read(fast=front_end == "fast", split=split)
    finally:
        if split is not None:
            split.close()
    header = reader.stream.header
    fs = FileSummary(
        str(path),
        reader.rank,
        reader.stream.events_seen,
        dict(reader.spans_by_category),
        dict(reader.skipped),
        _base_time(header, path),
        reader.flows_linked,
        ident.rank_source,
    )
    extra = {
        "processes": reader.processes,
        "threads": reader.threads,
        "profiler_windows": reader.profiler_windows,
        "workers": 1 if split is None or not split.helper_events else 2,
        "front_end": reader.front_end,
    }
    return fs, header, _file_meta(path, fs, extra, header)


def _base_time(header: dict, path: Path) -> int:
    """The file's time base in Unix ns (0 when absent: `ts` is then Unix µs)."""
    value = header.get("baseTimeNanoseconds")
    if value is None:
        return 0
    number = None if isinstance(value, bool) else value
    if isinstance(number, str) and number.isdigit():
        number = int(number)
    if not isinstance(number, int) or not 0 <= number <= 2**63 - 1:
        raise TraceFormatError(f"{path}: baseTimeNanoseconds {str(value)[:40]!r} is not a time "
                               "in ns since the Unix epoch")  # fmt: skip
    return number


def _strict_or_empty(value: dict) -> dict:
    """`value` when it is strict JSON (the manifest is), else nothing (NaN in a header)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return {}
    return value


def _file_meta(path: Path, fs: FileSummary, extra: dict, header: dict) -> dict:
    info = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    return {
        "path": str(path.resolve()),
        "bytes": path.stat().st_size,
        "rank": fs.rank,
        "rank_source": fs.rank_source,
        "world_size": info.get("world_size"),
        "backend": info.get("backend"),
        "distributed_info": _strict_or_empty(info),  # as the file has it: exports write it back
        "base_time_ns": fs.base_time_ns,
        "events": fs.events,
        "spans": fs.spans,
        "skipped": fs.skipped,
        "flows_linked": fs.flows_linked,
        "trace_name": header.get("traceName"),
        "workers": extra["workers"],
        "front_end": extra["front_end"],  # fast: the native decoder read it
        "profiler_windows": extra["profiler_windows"][:16],
        "processes": dict(list(extra["processes"].items())[:64]),
        "threads": dict(list(extra["threads"].items())[:256]),
        "header": {k: v for k, v in header.items() if isinstance(v, (int, str)) and k != "INFO"},
    }
