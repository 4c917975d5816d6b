"""`perfdiag import TRACE... --out RUN`: PyTorch-profiler (Kineto) traces into a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .app import app, out
from .json_output import print_json


@app.command("import")
def import_trace(
    traces: Annotated[
        list[Path],
        typer.Argument(
            help="Kineto Chrome-JSON traces (.json or .json.gz), one per rank; a directory: "
            "every *.json and *.json.gz in it."
        ),
    ],
    run: Annotated[Path, typer.Option("--out", "-o", help="The run directory to create.")],
    copy_raw: Annotated[
        bool, typer.Option("--copy-raw", help="Copy the traces into the run's raw/ folder.")
    ] = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            help="Processes per large trace: 1 reads every file in this process; by default "
            "the fast reader hands a large trace's tail to one helper process, and the exact "
            "reader (for files the fast one refuses) uses one per core, at most 4.",
            min=1,
            max=256,
        ),
    ] = None,
    rank: Annotated[
        list[int] | None,
        typer.Option(
            "--rank",
            help="Each file's rank, in the files' order (overrides the file's "
            "distributedInfo; give it once per file).",
            min=0,
            max=1 << 24,
        ),
    ] = None,
    use_ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Import each file in a Ray task, on a local cluster started for it "
            "(docs/ray_import.md).",
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="A running Ray cluster's address (HOST:PORT or 'auto'); implies --ray, as "
            "perfdiag run --clients takes it."
        ),
    ] = None,
    parts_dir: Annotated[
        Path | None,
        typer.Option(
            help="With --ray: where the tasks write each rank's run part (kept); on a "
            "real cluster, a shared filesystem path. Default: beside --out, removed."
        ),
    ] = None,
    then_timeline: Annotated[
        bool,
        typer.Option(
            "--timeline",
            help="Then show the run's timeline (what `perfdiag timeline RUN` shows, critical "
            "path included) in this process: one start-up instead of two. With --json: one "
            "document, the import's summary with the timeline's under \"timeline\".",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Import PyTorch-profiler traces (several ranks of one job become one run)."""
    import sys

    from ..errors import ConfigError
    from ..traces.importers.kineto import import_kineto
    from ..traces.importers.trace_files import trace_files

    if jobs is not None and jobs < 1:
        raise ConfigError("--jobs must be at least 1")
    traces = trace_files(traces)
    if ray_address is not None and not ray_address.strip():
        raise ConfigError("--ray-address is empty: give the cluster's HOST:PORT, or auto")
    use_ray = use_ray or ray_address is not None
    if not use_ray and parts_dir is not None:
        raise ConfigError("--parts-dir goes with --ray (or --ray-address)")
    if use_ray and then_timeline:
        raise ConfigError("--timeline goes with a local import: after --ray, run "
                          "`perfdiag timeline RUN`")  # fmt: skip
    if use_ray:
        if jobs is not None:
            raise ConfigError("--jobs does not apply with --ray (each task reads one file)")
        from .import_ray import import_ray

        import_ray(traces, run, address=ray_address, parts_dir=parts_dir, copy_raw=copy_raw,
                   ranks=rank or None, as_json=as_json)  # fmt: skip
        return
    s = import_kineto(
        traces,
        run,
        command=["perfdiag", *sys.argv[1:]],
        copy_raw=copy_raw,
        jobs=jobs,
        ranks=rank or None,
    )
    summary = {
        "run": str(s.out),
        "files": files_summary(s.files),
        "warnings": s.warnings,
        "events": s.events,
        "spans": s.spans,
        "seconds": round(s.seconds, 3),
        "events_per_s": round(s.events / s.seconds) if s.seconds else None,
    }
    for warning in s.warnings:
        print(f"perfdiag: warning: {warning}", file=sys.stderr)
    if as_json:
        if then_timeline:
            from .timeline import show_timeline

            summary["timeline"] = show_timeline(s.out, as_json=True)
        print_json(summary)
        return
    out.print(
        f"[bold]imported[/] {s.events:,} events from {len(s.files)} file(s) into {s.out} "
        f"in {s.seconds:.2f} s ({summary['events_per_s'] or 0:,} events/s)",
        highlight=False,
    )
    table = Table("category", "spans", title_justify="left")
    for cat, n in sorted(s.spans.items(), key=lambda kv: -kv[1]):
        table.add_row(cat, f"{n:,}")
    out.print(table)
    for f in s.files:
        skipped = ", ".join(f"{n} {what}" for what, n in f.skipped.items()) or "none"
        out.print(f"rank {f.rank}: {f.path} — skipped: {skipped}", highlight=False, markup=False)
    if then_timeline:
        from .timeline import show_timeline

        show_timeline(s.out)


def files_summary(files) -> list[dict]:
    """Each imported file as the JSON summary lists it (serial and Ray imports alike)."""
    return [
        {"path": f.path, "rank": f.rank, "rank_source": f.rank_source, "events": f.events,
         "skipped": f.skipped}
        for f in files
    ]  # fmt: skip
