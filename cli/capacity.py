"""`perfdiag capacity --slo …`: the highest request rate (or concurrency) whose repeated
runs meet the SLO at the given attainment, with the limiting cause at that load."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .app import app, out
from .signals import sigterm_as_interrupt


@app.command()
def capacity(
    slo: Annotated[str, typer.Option(help="The SLO, e.g. ttft=0.5,tpot=50ms (also itl, e2e).")],
    attainment: Annotated[
        float, typer.Option(help="Share of requests that must meet the SLO.")
    ] = 0.9,
    confidence: Annotated[
        float, typer.Option(help="Confidence of each level's meets/misses decision.")
    ] = 0.9,
    by: Annotated[str, typer.Option(help="Search the request rate or the concurrency.")] = "rate",
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A `perfdiag run` flag every level shares, e.g. preset=tiny, max-seqs=16.",
            show_default=False,
        ),
    ] = None,
    start: Annotated[
        float | None,
        typer.Option(
            help="First upper level [the closed-loop saturation throughput].", show_default=False
        ),
    ] = None,
    floor: Annotated[
        float | None, typer.Option(help="First lower level [start / 4].", show_default=False)
    ] = None,
    duration: Annotated[
        float, typer.Option(help="Seconds of arrivals per rate level (rate × duration requests).")
    ] = 20.0,
    tolerance: Annotated[
        float, typer.Option(help="Stop when the missing level is within this of the meeting one.")
    ] = 0.1,
    min_repeats: Annotated[int, typer.Option(help="Repeats at every level.")] = 2,
    max_repeats: Annotated[int, typer.Option(help="Repeats near the boundary, at most.")] = 4,
    target: Annotated[
        str | None,
        typer.Option(
            help="Drive this OpenAI-compatible server instead of engine_ref.", show_default=False
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="PERFDIAG_API_KEY", help="The target's key.", show_default=False),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Directory for the runs and capacity.json [capacity/<time>].",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress.")] = False,
) -> None:
    """Find the highest load that meets an SLO, and what limits it there."""
    from ..analyzers.slo import parse_slo
    from ..sweeps.capacity import SearchSettings
    from ..sweeps.capacity_runs import CapacityPlan, run_capacity
    from ..sweeps.spec import parse_assignment

    plan = CapacityPlan(
        base=dict(parse_assignment(s, many=False) for s in set_ or []),
        slo=parse_slo(slo),
        by=by,
        duration_s=duration,
        target=target,
        api_key=api_key,
    )
    settings = SearchSettings(attainment, confidence, tolerance, min_repeats, max_repeats,
                              integer=by == "concurrency")  # fmt: skip
    out_dir = out_dir or Path("capacity") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    unit = "req/s" if by == "rate" else "clients"
    out.print(f"perfdiag capacity: {slo} for {attainment:.0%} of requests "
              f"({confidence:.0%} confidence), by {by}, on {target or 'engine_ref'}, "
              f"into {out_dir}", highlight=False)  # fmt: skip

    def on_level(level) -> None:
        lo, hi = level.bounds(confidence)
        note = " (still unsure: counted as missing)" if level.forced else ""
        out.print(f"  {by} {level.x:g} {unit}: {level.decision}{note}, attainment "
                  f"{level.attainment:.1%} [{lo:.1%}, {hi:.1%}] over {len(level.samples)} "
                  "repeats", highlight=False)  # fmt: skip

    def on_run(label: str, p) -> None:
        if not quiet and p.done == p.total:
            out.print(f"    run {label}: {p.done} requests", style="dim", highlight=False)

    with sigterm_as_interrupt() as term:
        try:
            result, sat = run_capacity(plan, settings, out_dir, start, floor, on_run, on_level)
        except KeyboardInterrupt:
            how = "terminated" if term.received else "interrupted"
            out.print(f"[yellow]{how}[/]: the runs so far are kept in {out_dir}/runs")
            raise typer.Exit(143 if term.received else 130) from None
    print_capacity(result, sat, by, unit, out_dir)


def print_capacity(result, sat, by: str, unit: str, out_dir: Path) -> None:
    conf = result.settings.confidence
    t = Table(title="levels tried", title_justify="left")
    for name in (by, "decision", "attainment", f"{conf:.0%} bounds", "repeats", "top cause"):
        t.add_column(name, justify="right" if name not in ("decision", "top cause") else "left")
    for level in sorted(result.levels, key=lambda v: v.x):
        lo, hi = level.bounds(conf)
        cause = level.causes()[0] if level.samples else ("", "", 0)
        t.add_row(f"{level.x:g}", level.decision + (" (unsure)" if level.forced else ""),
                  f"{level.attainment:.1%}", f"{lo:.1%}–{hi:.1%}", str(len(level.samples)),
                  f"{cause[0]} ({cause[2]}/{len(level.samples)})")  # fmt: skip
    out.print(t)
    if sat is not None:
        out.print(f"saturation: {sat.requests_per_s:.2f} req/s with {sat.concurrency} clients "
                  f"in a closed loop (limit there: {sat.cause})", highlight=False)  # fmt: skip
    target = f"{result.settings.attainment:.0%}"
    cap, above = result.capacity, result.above
    if result.verdict == "below-floor":
        out.print(f"[red]no level meets the SLO[/]: even {by} {above.x:g} {unit} misses it "
                  f"({above.attainment:.1%} < {target}); limit: {_cause(above)}")  # fmt: skip
    elif result.verdict == "above-ceiling":
        out.print(f"capacity: at least {cap.x:g} {unit} (the search's ceiling still meets "
                  f"the SLO); give a higher --start to look further", highlight=False)  # fmt: skip
    else:
        step = (above.x / cap.x - 1) * 100
        out.print(f"[bold]capacity: {cap.x:g} {unit}[/] meets the SLO for "
                  f"{cap.attainment:.1%} of requests (≥ {target} at {conf:.0%} confidence, "
                  f"{len(cap.samples)} repeats); {above.x:g} {unit} (+{step:.0f}%) misses "
                  f"({above.attainment:.1%})", highlight=False)  # fmt: skip
        out.print(f"limiting cause at capacity (the runs at {above.x:g} {unit}): "
                  f"{_cause(above)}", highlight=False)  # fmt: skip
        for sample in above.samples:
            if sample.misses:
                out.print(f"  {Path(sample.run).name}: {sample.misses}", highlight=False)
    qualified = [v for v in result.levels if any(x.qualifier for x in v.samples)]
    if qualified:
        names = sorted({x.qualifier for v in qualified for x in v.samples if x.qualifier})
        out.print(f"[yellow]note[/]: {', '.join(names)} at {len(qualified)} level(s): other "
                  "load on this machine slowed those runs; the capacity found is that of a "
                  "shared machine", highlight=False)  # fmt: skip
    if result.non_monotone:
        out.print("[yellow]warning[/]: a level met the SLO above one that missed: noise or "
                  "a non-monotone system; raise --min-repeats or --duration")  # fmt: skip
    out.print(f"written: {out_dir}/capacity.json, runs in {out_dir}/runs", highlight=False)


def _cause(level) -> str:
    check, title, n = level.causes()[0]
    if check == "none":
        return f"no finding names one ({n}/{len(level.samples)} repeats)"
    return f"{check} — {title} ({n}/{len(level.samples)} repeats)"
