"""`perfdiag export RUN --format perfetto|chrome|tensorboard [--out PATH]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app, out
from .json_output import print_json

OPEN_WITH = {
    "perfetto": "open it at https://ui.perfetto.dev (Open trace file)",
    "chrome": "open it in chrome://tracing or https://ui.perfetto.dev",
    "tensorboard": "view it with `tensorboard --logdir {path}` (PyTorch Profiler tab)",
}


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="A run directory (recorded or imported).")],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="perfetto, chrome or tensorboard.")
    ] = "perfetto",
    dest: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="File to write (a log dir for tensorboard; .gz gzips Chrome JSON). "
            "Default: RUN/exports/.",
        ),
    ] = None,
    no_args: Annotated[
        bool, typer.Option("--no-args", help="Leave out the spans' recorded args (smaller).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Export a run for Perfetto, chrome://tracing or TensorBoard's profiler plugin."""
    from ..traces.exporters import export_run

    result = export_run(run, fmt.lower(), dest, with_args=not no_args)
    summary = {
        "format": result.format,
        "path": str(result.path),
        "files": [str(f) for f in result.files],
        "bytes": result.bytes,
        "slices": result.slices,
        "counter_samples": result.counter_samples,
        "instants": result.instants,
        "flows": result.flows,
        "seconds": round(result.seconds, 3),
        "warnings": result.warnings,
    }
    if as_json:
        print_json(summary)
        return
    what = f"{sum(result.slices.values()):,} slices" if result.slices else "the raw profiler trace"
    extra = (
        f", {result.counter_samples:,} counter samples, {result.flows:,} flows"
        if result.format != "tensorboard"
        else f" in {len(result.files)} file(s)"
    )
    out.print(
        f"[bold]wrote[/] {result.format} {result.path} ({what}{extra}; "
        f"{result.bytes / 1e6:.1f} MB in {result.seconds:.2f} s)",
        highlight=False,
    )
    for warning in result.warnings:
        out.print(f"[yellow]note:[/] {warning}", highlight=False)
    out.print(OPEN_WITH[result.format].format(path=result.path), highlight=False, markup=False)
