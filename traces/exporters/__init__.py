"""Exports: a run as a Perfetto trace, Chrome JSON, or a TensorBoard profiler log dir.

    from perfdiag.traces.exporters import export_run
    result = export_run("runs/x", "perfetto")          # → runs/x/exports/<run_id>.pftrace

Perfetto and Chrome JSON share one layout (`layout.py`) and differ only in the sink
that encodes it; TensorBoard gets Kineto's own trace layout (`tensorboard.py`). See
docs/export.md for what each format holds and how to open it.
"""

from __future__ import annotations

import gzip
import io
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..reader import Run, load_run
from .findings import Annotation
from .output import EXPORTS_DIR, ExportError, atomic_file, default_path

FORMATS = ("perfetto", "chrome", "tensorboard")
SUFFIXES = {"perfetto": ".pftrace", "chrome": ".trace.json"}

__all__ = ["FORMATS", "Annotation", "ExportError", "ExportResult", "export_run"]


@dataclass
class ExportResult:
    format: str
    path: Path
    slices: dict[str, int] = field(default_factory=dict)  # per kind (category)
    counter_samples: int = 0
    instants: int = 0
    flows: int = 0
    files: list[Path] = field(default_factory=list)  # TensorBoard: the trace files
    bytes: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(self.slices.values()) + self.counter_samples + self.instants


def export_run(
    run: str | os.PathLike | Run,
    fmt: str,
    out: str | os.PathLike | None = None,
    *,
    with_args: bool = True,
    annotations: list[Annotation] | None = None,
    tensorboard_source: str = "auto",
) -> ExportResult:
    """Export `run` as `fmt` into `out` (default: RUN/exports/). A Chrome `out` ending in
    .gz is gzipped. `annotations` replaces the run's findings as the instants to show."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    t0 = time.perf_counter()
    loaded = run if isinstance(run, Run) else load_run(run)
    if out is None:
        out = (
            Path(loaded.path) / EXPORTS_DIR / "tensorboard"
            if fmt == "tensorboard"
            else default_path(loaded.path, loaded.manifest.run_id, SUFFIXES[fmt])
        )
    out = Path(out)
    if fmt == "tensorboard":
        from .tensorboard import export_tensorboard

        result = export_tensorboard(loaded, out, source=tensorboard_source)
    else:
        result = _export_trace(loaded, fmt, out, with_args, annotations)
    result.seconds = time.perf_counter() - t0
    return result


def _export_trace(
    run: Run, fmt: str, out: Path, with_args: bool, annotations: list[Annotation] | None
) -> ExportResult:
    from .layout import write_run

    gz = fmt == "chrome" and out.name.endswith(".gz")
    with atomic_file(out, "wb") as raw:
        if fmt == "perfetto":
            from .perfetto import PerfettoSink

            sink = PerfettoSink(raw)
            summary = write_run(run, sink, with_args=with_args, annotations=annotations)
        else:
            from .chrome import ChromeSink
            from .identity import kineto_header

            stream = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) if gz else raw
            text = io.TextIOWrapper(stream, encoding="utf-8", write_through=False)
            sink = ChromeSink(text, extra_header=kineto_header(run))  # the job and its GPUs
            summary = write_run(run, sink, with_args=with_args, annotations=annotations)
            text.flush()
            text.detach()
            if gz:
                stream.close()
    return ExportResult(
        fmt,
        out,
        dict(summary.slices),
        summary.counter_samples,
        summary.instants,
        summary.flows,
        [out],
        out.stat().st_size,
        warnings=summary.warnings,
    )
