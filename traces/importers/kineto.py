"""`import_kineto(paths, out)`: PyTorch-profiler (Kineto) traces → one perfdiag run.

Several files of one job (one per rank) become one run with a `rank` column. The run is
written into a hidden sibling directory and renamed into place only once complete, so
an import that fails (a malformed or truncated file, Ctrl-C) leaves no run behind that
could be taken for a complete one.

Time: Kineto's `ts` is µs relative to the file's `baseTimeNanoseconds` (Unix ns; absent
in older traces, whose `ts` are Unix µs). Spans keep the first file's time base; other
files are shifted onto it, and the manifest's clock maps that base to wall time.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError, PerfdiagError
from ..layout import RAW_DIR
from ..manifest import CRASHED
from ..writer import RunWriter
from .chrome_stream import TraceFormatError
from .kineto_events import KinetoFileReader

_BASE_TIME = re.compile(r'"baseTimeNanoseconds"\s*:\s*(\d+)')
_TAIL_CHARS = 1 << 16
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


@dataclass
class ImportSummary:
    out: Path
    files: list[FileSummary] = field(default_factory=list)
    seconds: float = 0.0

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


def tail_base_time_ns(path: Path) -> int:
    """The file's `baseTimeNanoseconds` (Kineto writes it last), read from its tail;
    0 when absent (then `ts` is Unix µs)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    tail = ""
    try:
        if gz:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                while chunk := f.read(1 << 22):
                    tail = (tail + chunk)[-_TAIL_CHARS:]
        else:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - _TAIL_CHARS))
                tail = f.read().decode("utf-8", errors="replace")
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(f"{path}: compressed data is corrupt or truncated ({e})") from None
    m = _BASE_TIME.search(tail)
    return int(m.group(1)) if m else 0


def _gpus(device_properties) -> list[dict]:
    gpus = []
    for p in device_properties or []:
        if not isinstance(p, dict):
            continue
        gpus.append(
            {
                "index": p.get("id"),
                "name": p.get("name"),
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
        if key in h:
            env[name] = h[key]
    return env


def _rank_of(header: dict, index: int, n_files: int) -> int | None:
    info = header.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    return index if n_files > 1 else None


def import_kineto(
    paths: list[str | os.PathLike],
    out: str | os.PathLike,
    *,
    command: list[str] | None = None,
    copy_raw: bool = False,
) -> ImportSummary:
    """Import Kineto Chrome-JSON traces (plain or gzipped) into the run directory `out`."""
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
    # Several files: read each base time first so all go onto the first file's time base.
    bases = [tail_base_time_ns(p) for p in files] if len(files) > 1 else [None]
    writer = RunWriter(
        tmp,
        command=command,
        config={"importer": "kineto", "traces": [str(p.resolve()) for p in files]},
        source="kineto",
        environment_info={"recorded_by": RECORDED_BY},
        batch_rows=1 << 17,
    )
    summary = ImportSummary(out=out)
    try:
        headers, file_meta = [], []
        spans, counters = writer.table("spans"), writer.table("counters")
        for i, path in enumerate(files):
            offset = 0 if bases[0] is None else bases[i] - bases[0]
            reader = KinetoFileReader(
                path,
                spans.append,
                counters.append,
                rank_of=lambda h, i=i: _rank_of(h, i, len(files)),
                time_offset_ns=offset,
            )
            reader.read()
            header = reader.stream.header
            base = int(header.get("baseTimeNanoseconds") or 0)
            if bases[0] is not None and base != bases[i]:
                raise TraceFormatError(f"{path}: baseTimeNanoseconds changed while reading")
            headers.append(header)
            fs = FileSummary(
                str(path), reader.rank, reader.stream.events_seen, dict(reader.spans_by_category),
                dict(reader.skipped), base, reader.flows_linked,
            )  # fmt: skip
            summary.files.append(fs)
            file_meta.append(_file_meta(path, fs, reader, header))
        if copy_raw:
            (tmp / RAW_DIR).mkdir(exist_ok=True)
            for p in files:
                shutil.copy2(p, tmp / RAW_DIR / p.name)
        base0 = summary.files[0].base_time_ns
        writer.update_manifest(
            environment=_environment(headers),
            clock={
                "clock": "kineto",  # ns since the trace's time base
                "monotonic_ns": 0,
                "wall_ns": base0,
                "uncertainty_ns": 0,
                "resolution_ns": 1,
            },
            extra={**writer.manifest.extra, "kineto": {"files": file_meta}},
        )
        writer.close()
    except BaseException:
        writer.close(CRASHED)  # never complete-looking, then gone
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.rename(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PerfdiagError(f"{out}: cannot move the imported run into place ({e})") from None
    summary.seconds = time.perf_counter() - t0
    return summary


def _file_meta(path: Path, fs: FileSummary, reader: KinetoFileReader, header: dict) -> dict:
    info = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    return {
        "path": str(path.resolve()),
        "bytes": path.stat().st_size,
        "rank": fs.rank,
        "world_size": info.get("world_size"),
        "backend": info.get("backend"),
        "base_time_ns": fs.base_time_ns,
        "events": fs.events,
        "spans": fs.spans,
        "skipped": fs.skipped,
        "flows_linked": fs.flows_linked,
        "trace_name": header.get("traceName"),
        "profiler_windows": reader.profiler_windows[:16],
        "processes": dict(list(reader.processes.items())[:64]),
        "threads": dict(list(reader.threads.items())[:256]),
        "header": {k: v for k, v in header.items() if isinstance(v, (int, str)) and k != "INFO"},
    }
