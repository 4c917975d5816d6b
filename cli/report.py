"""`perfdiag report RUN`: the triage as one self-contained HTML file (results/report.html):
the verdict, the findings with their evidence, the triage steps and interactive plots,
rendered from the same triage view as `perfdiag analyze`, the TUI and report.md. It opens
offline (plotly.js is inlined); docs/report.md says what it shows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app, out
from .triage_options import Baseline, FullRun, Playbook, Slo, SloFile


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="A run directory.")],
    out_path: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Where to write it [RUN/results/report.html]."),
    ] = None,
    slo: Slo = None,
    slo_file: SloFile = None,
    full_run: FullRun = False,
    baseline: Baseline = None,
    playbook: Playbook = None,
) -> None:
    """Write the run's triage and plots as one HTML file that opens offline."""
    from ..playbooks.html_report import write_html
    from .analyze import triage_of

    ctx, triage, _ = triage_of(run, slo, slo_file, full_run, None, baseline, playbook)
    path = write_html(triage, ctx, out_path)
    size = path.stat().st_size / 2**20
    out.print(f"written: {path} ({size:.1f} MiB, self-contained)", highlight=False)
