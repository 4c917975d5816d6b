"""`perfdiag doctor`: what this machine offers for profiling."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .._version import __version__
from .app import STATUS_STYLE, app, out
from .json_output import print_json


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """What this machine offers for profiling (run this first when something looks off)."""
    from ..probes.doctor import run_checks

    checks = run_checks()
    if as_json:
        print_json([c.__dict__ for c in checks])
        return
    table = Table(title=f"perfdiag {__version__} doctor", title_justify="left")
    for column in ("area", "status", "what is here", "hint"):
        table.add_column(column, overflow="fold")
    for c in checks:
        style = STATUS_STYLE.get(c.status, "")
        table.add_row(c.area, f"[{style}]{c.status}[/]", escape(c.summary), escape(c.hint))
    out.print(table)
