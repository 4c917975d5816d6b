"""Options every command that triages a run shares (analyze, report, tui): what the
run is judged against and over which window."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Slo = Annotated[
    str | None,
    typer.Option(help="SLO targets for goodput, e.g. ttft=0.5,tpot=50ms (also itl, e2e)."),
]
SloFile = Annotated[Path | None, typer.Option(help="SLO targets from a YAML file (ttft: 0.5, …).")]
FullRun = Annotated[
    bool, typer.Option("--full-run", help="Metrics over the whole run, not the steady state.")
]
Baseline = Annotated[
    Path | None, typer.Option(help="A baseline run: steps 6 and 7 compare against it.")
]
Playbook = Annotated[
    Path | None, typer.Option(help="A triage playbook YAML instead of the built-in one.")
]
