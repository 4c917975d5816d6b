"""`perfdiag calibrate`: measure this machine's matmul FLOP/s and copy bandwidth and store
them, so rooflines use attained ceilings rather than datasheet peaks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .app import app, out
from .json_output import print_json


@app.command()
def calibrate(
    ceilings_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where to store the figures (default: $PERFDIAG_CEILINGS_DIR, "
            "else ~/.cache/perfdiag/ceilings)."
        ),
    ] = None,
    seconds: Annotated[
        float, typer.Option(help="Time budget of each measurement.", min=0.01, max=60)
    ] = 0.4,
    cpu_only: Annotated[bool, typer.Option("--cpu-only", help="Skip CUDA devices.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Measure matmul FLOP/s (per dtype) and copy bandwidth on the CPU and each GPU."""
    from ..errors import ConfigError
    from ..hardware.ceilings import datasheet_for, save_measured
    from ..probes.calibrate import CalibrationPlan, calibrate, others_load

    try:
        plan = CalibrationPlan(seconds_per_figure=seconds)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    measured = calibrate(plan, gpus=not cpu_only)
    try:
        path = save_measured(measured, ceilings_dir)
    except OSError as e:
        raise ConfigError(f"cannot write the ceilings ({e})") from None
    warnings = [f"{m.device}: {w}" for m in measured
                if (load := others_load(m)) is not None and (w := load.warning())]  # fmt: skip
    if as_json:
        print_json(
            {"path": str(path), "devices": [m.to_dict() for m in measured], "warnings": warnings}
        )
        return
    table = Table("device", "figure", "measured", "datasheet", "% of datasheet", title="ceilings")
    for m in measured:
        sheet = datasheet_for(m.device)
        rows = [(f"matmul {k}", v, sheet and sheet.flops_per_s.get(k), 1e12, "TFLOP/s")
                for k, v in m.flops_per_s.items()]  # fmt: skip
        rows.append(("copy bandwidth", m.bytes_per_s, sheet and sheet.bytes_per_s, 1e9, "GB/s"))
        for label, value, ref, scale, unit in rows:
            pct = f"{100 * value / ref:.0f}" if ref else ""
            ref_text = f"{ref / scale:,.2f} {unit}" if ref else ""
            table.add_row(m.device, label, f"{value / scale:,.3f} {unit}", ref_text, pct)
    out.print(table)
    for w in warnings:
        out.print(f"[yellow]warning[/]: {escape(w)}", highlight=False)
    out.print(f"stored in {path}", highlight=False)
