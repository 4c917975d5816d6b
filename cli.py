"""The `perfdiag` command line. Commands only parse, call into the package and format.

Any PerfdiagError becomes one line on stderr and exit code 1; Ctrl-C exits 130.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._version import __version__
from .errors import PerfdiagError

app = typer.Typer(
    name="perfdiag",
    help="Profile and diagnose LLM inference: capture runs, analyse them, follow the triage.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
out = Console()
STATUS_STYLE = {
    "ok": "green",
    "warn": "yellow",
    "missing": "red",
    "complete": "green",
    "running": "cyan",
    "interrupted": "yellow",
    "crashed": "red",
}


def _version(value: bool) -> None:
    if value:
        print(f"perfdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """perfdiag: profiling and performance diagnosis for LLM inference."""


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """What this machine offers for profiling (run this first when something looks off)."""
    from .probes.doctor import run_checks

    checks = run_checks()
    if as_json:
        print(json.dumps([c.__dict__ for c in checks], indent=2))
        return
    table = Table(title=f"perfdiag {__version__} doctor", title_justify="left")
    for column in ("area", "status", "what is here", "hint"):
        table.add_column(column, overflow="fold")
    for c in checks:
        style = STATUS_STYLE.get(c.status, "")
        table.add_row(c.area, f"[{style}]{c.status}[/]", escape(c.summary), escape(c.hint))
    out.print(table)


@app.command()
def inspect(
    run: Annotated[Path, typer.Argument(help="A run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Summarise a run: identity, status, environment, table row counts and time span."""
    from .traces.reader import load_run

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
    }
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
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
    gpus = ", ".join(g["name"] for g in env.get("gpus", [])) or "no GPU recorded"
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
    for w in s["warnings"]:
        out.print(f"[yellow]note[/] {escape(w)}")


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="perfdiag", standalone_mode=True)
    except PerfdiagError as e:
        print(f"perfdiag: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("perfdiag: interrupted", file=sys.stderr)
        sys.exit(130)
