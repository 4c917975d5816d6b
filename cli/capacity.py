"""`perfdiag capacity --slo …`: the highest request rate (or concurrency) whose repeated
runs meet the SLO at the given attainment, with the limiting cause at that load."""

from __future__ import annotations

import datetime as dt
import math
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
def capacity(
    slo: Annotated[str, typer.Option(help="The SLO, e.g. ttft=0.5,tpot=50ms (also itl, e2e).")],
    attainment: Annotated[
        float, typer.Option(help="Share of requests that must meet the SLO.")
    ] = 0.9,
    confidence: Annotated[
        float, typer.Option(help="Confidence of each level's meets/misses decision.")
    ] = 0.9,
    by: Annotated[str, typer.Option(help="Search the request rate or the concurrency.")] = "rate",
    set_: set_flags("level", "preset=tiny, max-seqs=16") = None,
    start: Annotated[
        float | None,
        typer.Option(
            help="First upper level (default: the closed-loop saturation throughput).",
            show_default=False,
        ),
    ] = None,
    floor: Annotated[
        float | None,
        typer.Option(help="First lower level (default: start / 4).", show_default=False),
    ] = None,
    duration: Annotated[
        float, typer.Option(help="Seconds of arrivals per rate level (rate × duration requests).")
    ] = 20.0,
    tolerance: Annotated[
        float, typer.Option(help="Stop when the missing level is within this of the meeting one.")
    ] = 0.1,
    min_repeats: Annotated[int, typer.Option(help="Repeats at every level.")] = 2,
    max_repeats: Annotated[int, typer.Option(help="Repeats near the boundary, at most.")] = 4,
    target: Target = None,
    api_key: ApiKey = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Directory for the runs and capacity.json (default: capacity/TIME).",
            show_default=False,
        ),
    ] = None,
    vary: Annotated[
        str | None,
        typer.Option(
            metavar="FLAG=VALUES",
            help="One capacity per value of a `perfdiag run` flag, e.g. chunk-size=64,256,off "
            "or max-seqs=8,32: which configuration serves the most under the SLO.",
            show_default=False,
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Find the highest load that meets an SLO, and what limits it there."""
    from ..analyzers.slo import parse_slo
    from ..sweeps.capacity import SearchSettings
    from ..sweeps.capacity_runs import CapacityPlan
    from ..sweeps.spec import parse_assignment, show, with_flag

    check_levels(start, floor, by)
    base = dict(parse_assignment(s, many=False) for s in set_ or [])
    configs: list[tuple[str, dict]] = [("", base)]
    if vary is not None:
        flag, values = parse_assignment(vary, many=True)
        if flag in base:
            raise ConfigError(f"{flag.replace('_', '-')} is both set and varied")
        label = flag.replace("_", "-")
        configs = [(f"{label}={show(v)}", with_flag(base, flag, v)) for v in values]
    plans = []
    for name, flags in configs:
        plan = CapacityPlan(flags, parse_slo(slo), by, duration, target=target, api_key=api_key)
        plan.check()  # every configuration, before the first search starts
        plans.append((name, plan))
    settings = SearchSettings(attainment, confidence, tolerance, min_repeats, max_repeats,
                              integer=by == "concurrency")  # fmt: skip
    out_dir = out_dir or Path("capacity") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    unit = "req/s" if by == "rate" else "clients"
    out.print(f"perfdiag capacity: {slo} for {attainment:.0%} of requests "
              f"({confidence:.0%} confidence), by {by}, on {target or 'engine_ref'}, "
              f"into {out_dir}", highlight=False)  # fmt: skip
    found = []
    for name, plan in plans:
        where = out_dir / name if name else out_dir
        if name:
            out.print(f"[bold]{name}[/]", highlight=False)
        result, sat = _search(plan, settings, where, start, floor, quiet, by, unit)
        print_capacity(result, sat, by, unit, where)
        found.append((name, result))
    if len(found) > 1:
        print_configs(found, by, unit, out_dir)


def check_levels(start: float | None, floor: float | None, by: str) -> None:
    """--start and --floor are loads the search can begin from: finite, positive (whole
    clients by concurrency), the floor below the start."""
    least = 1 if by == "concurrency" else 0
    for flag, value in (("--start", start), ("--floor", floor)):
        if value is None:
            continue
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{flag} must be a load > 0, got {value:g}")
        if value < least:
            raise ConfigError(f"{flag} must be at least 1 client by concurrency, got {value:g}")
    if start is not None and floor is not None and not floor < start:
        raise ConfigError(f"--floor ({floor:g}) must be below --start ({start:g}): the search "
                          "starts at --start and looks down to --floor")  # fmt: skip


def _search(plan, settings, out_dir: Path, start, floor, quiet: bool, by: str, unit: str):
    from ..sweeps.capacity_progress import CapacityProgress
    from ..sweeps.capacity_runs import CapacityInterrupted, run_capacity

    confidence = settings.confidence
    progress = CapacityProgress(settings)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[n]}"),
                   TextColumn("{task.fields[status]}"), console=out, transient=True,
                   disable=quiet)  # fmt: skip
    task = bar.add_task("starting", total=None, status=progress.line(), n="")
    last_end, ended = [time.monotonic()], set()  # a run's time: since the one before ended

    def on_level(level) -> None:
        progress.level_done(level)
        lo, hi = level.bounds(confidence)
        note = " (still unsure: counted as missing)" if level.forced else ""
        if plan.few_requests(level.x):
            n = plan.flags(level.x, 0)["requests"]
            note += (f" ({n} requests a run at --duration {plan.duration_s:g} s: few, so "
                     "the bounds are wide; a longer --duration decides sooner)")  # fmt: skip
        out.print(f"  {by} {level.x:g} {unit}: {level.decision}{note}, attainment "
                  f"{level.attainment:.1%} [{lo:.1%}, {hi:.1%}] over {len(level.samples)} "
                  "repeats", highlight=False)  # fmt: skip

    def on_run(label: str, p) -> None:
        if p.done == p.total and label not in ended:
            ended.add(label)
            progress.run_done(time.monotonic() - last_end[0])
            last_end[0] = time.monotonic()
            if not quiet:
                out.print(f"    run {label}: {p.done} requests", style="dim", highlight=False)
        bar.update(task, description=f"run {label}", completed=p.done, total=p.total,
                   status=progress.line(), n=f"{p.done}/{p.total} requests")  # fmt: skip

    with sigterm_as_interrupt() as term, bar:
        try:
            return run_capacity(plan, settings, out_dir, start, floor, on_run, on_level)
        except (CapacityInterrupted, KeyboardInterrupt) as e:
            bar.stop()
            how = "terminated" if term.received else "interrupted"
            if isinstance(e, CapacityInterrupted):
                n = e.levels
                out.print(f"[yellow]{how}[/]: {n} level{'s' * (n != 1)} finished, kept in "
                          f"{e.path} (verdict interrupted); every run so far in "
                          f"{out_dir}/runs", highlight=False)  # fmt: skip
            else:
                out.print(f"[yellow]{how}[/]: the runs so far are kept in {out_dir}/runs")
            raise typer.Exit(143 if term.received else 130) from None


def print_configs(found, by: str, unit: str, out_dir: Path) -> None:
    """Capacity per configuration, the best first, and capacities.json."""
    import json

    def value(r) -> float:
        return r.capacity.x if r.capacity is not None else 0.0

    t = Table(title=f"capacity by configuration ({unit})", title_justify="left")
    for name in ("configuration", "capacity", "misses at", "limit where it breaks"):
        t.add_column(name, justify="right" if name in ("capacity", "misses at") else "left")
    rows = []
    for name, r in sorted(found, key=lambda nr: -value(nr[1])):
        cap = f"{r.capacity.x:g}" if r.capacity else "none"
        if r.verdict == "above-ceiling":
            cap = f"≥ {cap}"
        above = f"{r.above.x:g}" if r.above else "–"
        limit = r.above.causes(r.settings.attainment)[0][0] if r.above and r.above.samples else "–"
        t.add_row(name, cap, above, limit)
        rows.append({"configuration": name, "verdict": r.verdict, "capacity": value(r) or None,
                     "above": r.above.x if r.above else None, "limit": limit})  # fmt: skip
    out.print(t)
    from ..traces.atomic_file import write_atomic

    write_atomic(out_dir / "capacities.json",
                 json.dumps({"by": by, "configurations": rows}, indent=2) + "\n")  # fmt: skip


def print_capacity(result, sat, by: str, unit: str, out_dir: Path) -> None:
    conf = result.settings.confidence
    t = Table(title="levels tried", title_justify="left")
    for name in (by, "decision", "attainment", f"{conf:.0%} bounds", "repeats", "top cause"):
        t.add_column(
            name,
            justify="right" if name not in ("decision", "top cause") else "left",
            overflow="fold",
        )  # a check id wraps; it is never cut
    for level in sorted(result.levels, key=lambda v: v.x):
        lo, hi = level.bounds(conf)
        cause = level.causes()[0] if level.samples else ("", "", 0)
        t.add_row(f"{level.x:g}", level.decision + (" (unsure)" if level.forced else ""),
                  f"{level.attainment:.1%}", f"{lo:.1%}–{hi:.1%}", str(len(level.samples)),
                  f"{cause[0]} ({cause[2]}/{len(level.samples)})")  # fmt: skip
    out.print(fit(t, out))
    if sat is not None:
        out.print(f"saturation: {sat.requests_per_s:.2f} req/s with {sat.concurrency} clients "
                  f"in a closed loop (limit there: {sat.cause})", highlight=False)  # fmt: skip
    target = f"{result.settings.attainment:.0%}"
    cap, above = result.capacity, result.above
    if result.verdict == "below-floor":
        out.print(f"[red]no level meets the SLO[/]: even {by} {above.x:g} {unit} misses it "
                  f"({above.attainment:.1%} < {target}); limit: "
                  f"{_cause(above, result.settings.attainment)}")  # fmt: skip
    elif result.verdict == "above-ceiling":
        out.print(f"capacity: at least {cap.x:g} {unit} (the search's ceiling still meets "
                  f"the SLO); give a higher --start to look further", highlight=False)  # fmt: skip
    else:
        step = (above.x / cap.x - 1) * 100
        out.print(f"[bold]capacity: {cap.x:g} {unit}[/] meets the SLO for "
                  f"{cap.attainment:.1%} of requests (≥ {target} at {conf:.0%} confidence, "
                  f"{len(cap.samples)} repeats); {above.x:g} {unit} (+{step:.0f}%) misses "
                  f"({above.attainment:.1%})", highlight=False)  # fmt: skip
        out.print(f"limiting cause at capacity (the runs at {above.x:g} {unit} that fell "
                  f"short): {_cause(above, result.settings.attainment)}",
                  highlight=False)  # fmt: skip
        for sample in above.samples:
            if sample.misses and sample.attainment < result.settings.attainment:
                out.print(f"  {Path(sample.run).name}: {sample.misses}", highlight=False)
    for host in (True, False):  # other load on the machine, or another caveat on the data
        qualified = [v for v in result.levels
                     if any(x.qualifier and x.qualifier.startswith("host") == host
                            for x in v.samples)]  # fmt: skip
        if not qualified:
            continue
        names = sorted({x.qualifier for v in qualified for x in v.samples
                        if x.qualifier and x.qualifier.startswith("host") == host})  # fmt: skip
        why = ("other load on this machine slowed those runs; the capacity found is that "
               "of a shared machine" if host else "a caveat on those runs' data (each run's "
               "triage says why)")  # fmt: skip
        out.print(f"[yellow]note[/]: {', '.join(names)} at {len(qualified)} level(s): {why}",
                  highlight=False)  # fmt: skip
    if result.non_monotone:
        out.print("[yellow]warning[/]: a level met the SLO above one that missed: noise or "
                  "a non-monotone system; raise --min-repeats or --duration")  # fmt: skip
    out.print(f"written: {out_dir}/capacity.json, runs in {out_dir}/runs", highlight=False)


def _cause(level, short_of: float) -> str:
    check, title, n = level.causes(short_of)[0]
    short = [s for s in level.samples if s.attainment < short_of] or level.samples
    if check == "none":
        return f"no finding names one ({n}/{len(short)} repeats; see what the misses were made of)"
    return f"{check} — {title} ({n}/{len(short)} repeats)"
