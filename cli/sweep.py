"""`perfdiag sweep`: a grid of runs over engine knobs and load, each a normal run, with a
table (confidence intervals), plots and a summary that names the knee and the limiting
cause on either side of it."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from ..errors import ConfigError
from .app import app, out
from .fit import fit
from .many_runs import ApiKey, Quiet, Target, set_flags
from .signals import sigterm_as_interrupt


@app.command()
def sweep(
    file: Annotated[
        Path | None,
        typer.Argument(
            help="A sweep YAML file (base:, vary:, repeats:, slo:, target:).", show_default=False
        ),
    ] = None,
    vary: Annotated[
        list[str] | None,
        typer.Option(
            "--vary",
            metavar="FLAG=VALUES",
            help="An axis: a `perfdiag run` flag and its values, e.g. chunk-size=64,128,256, "
            "rate=1:16:x2 (doubling) or max-seqs=8:64:+8. Several: their grid.",
            show_default=False,
        ),
    ] = None,
    set_: set_flags("point", "preset=tiny, requests=60") = None,
    repeats: Annotated[int, typer.Option(help="Runs per point (intervals need 2+).")] = 1,
    slo: Annotated[
        str | None,
        typer.Option(
            help="SLO for goodput and attainment, e.g. ttft=0.5,tpot=50ms.", show_default=False
        ),
    ] = None,
    knee_metric: Annotated[
        str | None,
        typer.Option(
            help="The curve whose knee to name, e.g. ttft_p99_ms, itl_p99_ms, "
            "attainment (default: chosen from the axis).",
            show_default=False,
        ),
    ] = None,
    target: Target = None,
    api_key: ApiKey = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Sweep directory (default: sweeps/TIME); an existing one "
            "with the same sweep continues it.",
            show_default=False,
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Sweep engine knobs and load: every point a run; the knee and why the curve bends."""
    from ..sweeps import spec as spec_mod

    if file is not None:
        if vary or set_ or slo or target:
            raise ConfigError("give a sweep file or --vary/--set/--slo/--target, not both")
        spec = spec_mod.from_file(file, api_key)
        if repeats != 1:
            spec = spec_mod.SweepSpec(spec.base, spec.axes, repeats, spec.slo, spec.target,
                                      spec.api_key)  # fmt: skip
    else:
        spec = spec_mod.from_command_line(set_ or [], vary or [], repeats, slo, target, api_key)
    if knee_metric is not None:
        _check_metric(knee_metric)
    out_dir = out_dir or Path("sweeps") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    print_result(spec, _run(spec, out_dir, quiet, knee_metric))


def _check_metric(name: str) -> None:
    from ..sweeps.table import LABELS

    if name not in LABELS:
        raise ConfigError(f"unknown --knee-metric {name!r}; choose one of {', '.join(LABELS)}")


def _run(spec, out_dir: Path, quiet: bool, knee_metric: str | None):
    from ..sweeps.runner import SweepInterrupted, arrival_seconds, run_sweep, validate

    plans = validate(spec)
    n = len(plans)
    where = spec.target or "engine_ref"
    out.print(f"perfdiag sweep: {n} points × {spec.repeats} repeat(s) on {where}, "
              f"into {out_dir}", highlight=False)  # fmt: skip
    arrivals = arrival_seconds(plans)
    if arrivals is not None:
        out.print(f"the arrival schedules alone take {_duration(arrivals * spec.repeats)}",
                  highlight=False)  # fmt: skip
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} runs"),
        TextColumn("{task.fields[eta]}"),
        console=out,
        transient=True,
        disable=quiet,
    )
    task = bar.add_task("", total=n * spec.repeats, eta="")
    started = time.monotonic()
    seen = []  # the sweep's progress: how many runs were recorded now, how many reused

    def show(p) -> None:
        seen[:] = [p]
        eta = p.eta_s
        left = f"~{_duration(eta)} left" if eta is not None else "estimating…"
        desc = f"{p.point} r{p.repeat} ({p.requests_done}/{p.requests_total} requests)"
        bar.update(task, completed=p.done_runs, description=desc, eta=left)

    with sigterm_as_interrupt() as term, bar:
        try:
            result = run_sweep(spec, out_dir, show, knee_metric, plans)
        except SweepInterrupted as e:
            bar.stop()
            how = "terminated" if term.received else "interrupted"
            out.print(f"[yellow]{how}[/]: {e.done} of {e.total} runs finished and kept in "
                      f"{out_dir}; the same command continues the sweep")  # fmt: skip
            raise typer.Exit(143 if term.received else 130) from None
    out.print(_runs_done(seen[0] if seen else None, time.monotonic() - started), highlight=False)
    return result


def _runs_done(progress, seconds: float) -> str:
    """'4 runs recorded in 12 s; 2 complete runs reused': a resume that records
    nothing says so rather than counting reused runs as run."""
    recorded = len(progress.recorded_s) if progress is not None else 0
    reused = progress.done_runs - recorded if progress is not None else 0
    took = _duration(seconds)
    runs = f"{reused} complete run{'s' * (reused != 1)} reused"
    if not recorded:
        return f"no run recorded: {runs} (read and analysed again in {took})"
    text = f"{recorded} run{'s' * (recorded != 1)} recorded in {took}"
    return text + (f"; {runs}" if reused else "")


def _duration(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"


def print_result(spec, result) -> None:
    from ..sweeps.causes import readable
    from ..sweeps.spec import show

    table = result.table
    t = Table(title=f"sweep {result.path} (latency in ms)", title_justify="left")
    axes = [a.flag for a in spec.axes]
    for a in spec.axes:
        t.add_column(a.label, justify="right")
    metrics = ["ttft_p99_ms", "itl_p99_ms", "output_tok_s"]
    if spec.slo:
        metrics.append("attainment")
    heads = {"ttft_p99_ms": "TTFT p99", "itl_p99_ms": "ITL p99", "output_tok_s": "tok/s",
             "attainment": "SLO met"}  # fmt: skip
    for m in metrics:
        t.add_column(heads[m], justify="right")
    causes = [readable(r.get("cause"), r.get("cause_title")) for _, r in table.iterrows()]
    t.add_column("limiting cause (top finding)", min_width=16, overflow="fold")
    for (_, r), cause in zip(table.iterrows(), causes, strict=True):
        cells = [show(r[a]) for a in axes]
        for m in metrics:
            v = r.get(m)
            cells.append("–" if v is None or v != v else f"{v:.2f}" if m == "attainment"
                         else f"{v:,.1f}")  # fmt: skip
        cells.append(cause)
        t.add_row(*cells)
    out.print(fit(t, out))
    for s in result.summaries:
        out.print(f"• {s.text}", highlight=False)
    results = result.path / "results"
    out.print(f"written: {results}/points.csv, summary.md, "
              + ", ".join(result.figures), highlight=False)  # fmt: skip
