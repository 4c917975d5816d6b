"""`perfdiag tui RUN [RUN_B]`: the interactive explorer (Textual), over SSH or locally.

The runs are opened here, before the screen is taken over, so a missing or corrupt run
is one line on stderr and exit code 1; a table found corrupt while the app analyses it
ends the app the same way, and any other error ends it as an internal error (one line,
its traceback in a file), never a traceback on a screen with exit code 0."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app


@app.command()
def tui(
    run: Annotated[
        Path, typer.Argument(help="A run directory (recorded or imported), or a sweep's.")
    ],
    run_b: Annotated[
        Path | None, typer.Argument(help="A second run: compared with RUN (RUN the baseline).")
    ] = None,
    slo: Annotated[
        str | None, typer.Option(help="SLO targets for goodput, e.g. ttft=0.5,tpot=50ms.")
    ] = None,
    full_run: Annotated[
        bool, typer.Option("--full-run", help="Metrics over the whole run, not the steady state.")
    ] = False,
    ceilings_dir: Annotated[
        Path | None, typer.Option(help="Measured ceilings for the roofline (perfdiag calibrate).")
    ] = None,
) -> None:
    """Explore a run: the triage, each step's evidence, every request and step."""
    from ..analyzers.slo import parse_slo
    from ..traces.reader import load_run
    from ..tui.app import make_app
    from .option_checks import check_ceilings_dir

    check_ceilings_dir(ceilings_dir)  # before the screen is taken over
    target = parse_slo(slo) if slo else None
    if (run / "sweep.json").exists() and run_b is None:  # perfdiag sweep's directory
        from ..tui.sweep_app import make_sweep_app

        explorer = make_sweep_app(run, slo=target, steady=not full_run)
    else:
        runs = [load_run(p) for p in (run, run_b) if p is not None]
        explorer = make_app(runs, slo=target, steady=not full_run, ceilings_dir=ceilings_dir)
    explorer.run()
    if explorer.error is not None:
        raise explorer.error
