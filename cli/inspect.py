"""`perfdiag inspect RUN`: a run's identity, status, tables and time span."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .app import STATUS_STYLE, app, out
from .json_output import print_json


@app.command()
def inspect(
    run: Annotated[Path, typer.Argument(help="A run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Summarise a run: identity, status, environment, table row counts and time span."""
    from ..traces.reader import load_run

    r = load_run(run)
    m = r.manifest
    span = r.time_span_ns()
    summary = {
        "path": str(r.path),
        "run_id": m.run_id,
        "status": r.status,
        "source": m.source,
        "schema_version": m.schema_version,
        "perfdiag_version": m.perfdiag_version,
        "created_at": m.created_at,
        "ended_at": m.ended_at,
        "command": m.command,
        "rows": r.row_counts(),
        "missing_tables": r.missing_tables,
        "first_ns": span[0] if span else None,
        "last_ns": span[1] if span else None,
        "duration_ns": span[1] - span[0] if span else None,
        "environment": m.environment,
        "warnings": r.warnings,
        "dropped_records": m.extra.get("dropped_records", {}),
        "skipped_events": _skipped_events(m.extra),
        "write_error": m.extra.get("write_error"),
    }
    if as_json:
        print_json(summary)
        return
    _print_inspect(summary, m.wall_ns)


def _wall(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).isoformat(timespec="milliseconds")


def _print_inspect(s: dict, wall_ns) -> None:
    style = STATUS_STYLE.get(s["status"], "")
    out.print(f"[bold]run[/] {s['run_id']}  [{style}]{s['status']}[/]  ({s['path']})")
    out.print(
        f"source {s['source']} · schema v{s['schema_version']} · "
        f"perfdiag {s['perfdiag_version']} · created {s['created_at']}"
    )
    out.print(f"command: {' '.join(s['command'])}", markup=False, highlight=False)
    env = s["environment"]
    pkgs = env.get("packages", {})
    gpus = ", ".join(str(g.get("name") or "unnamed GPU") for g in env.get("gpus", []))
    gpus = gpus or "no GPU recorded"
    out.print(
        f"environment: Python {env.get('python')} · torch {pkgs.get('torch')} · "
        f"triton {pkgs.get('triton')} · {env.get('cpu_model')} · {gpus} · "
        f"git {env.get('git_revision')}",
        highlight=False,
    )
    if s["duration_ns"] is not None:
        out.print(
            f"time span: {s['duration_ns'] / 1e9:.6f} s, "
            f"{_wall(wall_ns(s['first_ns']))} → {_wall(wall_ns(s['last_ns']))}"
        )
    table = Table("table", "rows", title_justify="left")
    for name, rows in s["rows"].items():
        table.add_row(name, f"{rows:,}" + (" (absent)" if name in s["missing_tables"] else ""))
    out.print(table)
    for name, n in s["dropped_records"].items():
        out.print(f"[yellow]dropped[/] {n} malformed {name} record(s) while recording")
    if s["write_error"]:
        out.print(f"[red]{escape(s['write_error'])}[/]: the run stopped there")
    skipped = s["skipped_events"]
    if skipped:
        reasons = ", ".join(
            f"{n:,} {why}" for why, n in sorted(skipped.items(), key=lambda x: -x[1])
        )
        out.print(f"[yellow]import skipped[/] {sum(skipped.values()):,} events: {escape(reasons)}")
    for w in s["warnings"]:
        out.print(f"[yellow]note[/] {escape(w)}")


def _skipped_events(extra: dict) -> dict[str, int]:
    """Trace events an importer skipped, by reason, over every imported file."""
    files = (
        (extra.get("kineto") or {}).get("files") if isinstance(extra.get("kineto"), dict) else None
    )
    total: dict[str, int] = {}
    for f in files if isinstance(files, list) else []:
        skipped = f.get("skipped") if isinstance(f, dict) else None
        for why, n in (skipped or {}).items() if isinstance(skipped, dict) else ():
            if isinstance(n, int):
                total[str(why)] = total.get(str(why), 0) + n
    return total
