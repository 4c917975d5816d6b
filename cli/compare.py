"""`perfdiag compare RUN_A RUN_B`: what changed between two runs (triage step 6), how the
end-to-end metrics moved with bootstrap intervals, whether the outputs are still the
same (step 7), and which findings appeared or disappeared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .app import app, out
from .findings_view import severity
from .fit import fit

VERDICT_STYLE = {"better": "green", "worse": "red", "same": "dim", "unknown": "dim"}


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="The baseline run.")],
    run_b: Annotated[Path, typer.Argument(help="The run to compare with it.")],
    full_run: Annotated[
        bool, typer.Option("--full-run", help="Metrics over whole runs, not steady states.")
    ] = False,
    resamples: Annotated[
        int, typer.Option(help="Bootstrap resamples for the intervals.", min=100, max=20_000)
    ] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap.", min=0, max=2**32 - 1)] = 0,
    top: Annotated[
        int, typer.Option(help="Rows in each table of the trace diff.", min=1, max=10_000)
    ] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Compare two runs: the trace diff (when both hold spans), configuration diff, metric
    deltas with intervals, correctness."""
    from ..analyzers.serving import analyze_serving, to_jsonable
    from ..playbooks.comparison import compare as compare_runs
    from ..playbooks.facts import TriageContext
    from ..traces.reader import load_run

    def context(path: Path) -> TriageContext:
        run = load_run(path)
        return TriageContext(run, analyze_serving(run, steady=not full_run))

    c = compare_runs(context(run_a), context(run_b), n_boot=resamples, seed=seed)
    if as_json:
        print(json.dumps(to_jsonable(c), indent=2))
        return
    out.print(f"[bold]A[/] {c.run_a} ({run_a})\n[bold]B[/] {c.run_b} ({run_b})", highlight=False)
    if c.trace is not None:  # runs that hold spans: what changed in them comes first
        from .compare_trace import print_trace_diff

        print_trace_diff(c.trace, top=top)
    _variables(c.diff, c.deltas, c.trace)
    served = bool(c.deltas) or c.correctness.comparable
    if served or c.trace is None:
        _deltas(c.deltas)
        _correctness(c.correctness)
    else:
        out.print("[dim]serving metrics and correctness: not compared (no requests)[/]")
    _finding_changes(c)


def _variables(diff, deltas, trace=None) -> None:
    main = diff.variables
    t = Table("variable", "A", "B", "kind", title="what changed (step 6)", title_justify="left")
    for ch in diff.changes:
        style = "" if ch.kind != "measurement" else "dim"
        t.add_row(escape(ch.name), escape(ch.a), escape(ch.b), ch.kind, style=style)
    if diff.changes:
        out.print(fit(t, out))
    if len(main) > 1:
        names = ", ".join(ch.name for ch in main)
        out.print(
            f"[bold red]warning[/]: {len(main)} main variables changed ({escape(names)}): "
            "no difference below can be pinned on one of them",
            highlight=False,
        )
    elif len(main) == 1:
        ch = main[0]
        out.print(
            f"one main variable changed: [bold]{escape(ch.name)}[/] "
            f"({escape(ch.a)} → {escape(ch.b)})",
            highlight=False,
        )
    else:
        moved = [d.label for d in deltas if d.verdict in ("worse", "better")]
        traced = 0 if trace is None else len(trace.changed())
        if traced:
            out.print(
                f"no recorded variable changed, yet the traces differ in {traced} ops "
                "(above): something the runs do not record differs (code, inputs, "
                "compiler or library settings)",
                highlight=False,
            )
        elif moved:
            out.print(
                f"[bold yellow]no recorded variable changed, yet {len(moved)} metrics moved "
                f"beyond noise[/] ({escape(', '.join(moved))}): something the runs do not "
                "record differs (other load on the host, clocks, thermal state) — not repeats",
                highlight=False,
            )
        else:
            out.print("no main variable changed and no metric moved beyond noise: repeats")
    for note in diff.notes:
        out.print(f"[dim]note: {escape(note)}[/]")


def _deltas(deltas) -> None:
    if not deltas:
        out.print("[yellow]metrics[/]: not compared, a run has no serving metrics")
        return
    t = Table(
        "metric",
        "A",
        "B",
        "Δ (B − A)",
        "Δ %",
        "95% interval of Δ",
        "verdict",
        title="end-to-end metrics",
        title_justify="left",
    )
    for d in deltas:
        a, b, delta, rel, interval = d.texts()
        verdict = d.verdict if d.verdict != "unknown" else "no interval"
        t.add_row(
            f"{d.label} ({d.unit})" + (" *" if d.note else ""),
            a,
            b,
            delta,
            rel,
            interval,
            f"[{VERDICT_STYLE[d.verdict]}]{verdict}[/]",
        )
    out.print(fit(t, out, keep=["verdict"], drop=["Δ %"]))
    for note in dict.fromkeys(d.note for d in deltas if d.note):  # once each, in order
        out.print(f"[dim]* {escape(note)}[/]", highlight=False)


def _correctness(c) -> None:
    if not c.comparable:
        out.print(f"[yellow]correctness (step 7)[/]: not compared — {escape(c.reason)}")
        return
    if c.mismatched:
        out.print(
            f"[bold red]correctness failure (step 7)[/]: outputs differ for {c.mismatched} "
            f"of {c.compared} requests (mismatch rate {c.mismatch_rate:.1%}; "
            f"{c.length_mismatched} differ in length), e.g. "
            f"{', '.join(c.mismatched_ids[:5])}",
            highlight=False,
        )
    else:
        out.print(
            f"[green]correctness (step 7)[/]: outputs identical for all {c.compared} "
            "requests compared (mismatch rate 0%)"
        )
    out.print(f"[dim]log-probabilities: {escape(c.logprobs)}[/]")


def _finding_changes(c) -> None:
    if c.findings:
        t = Table(
            "check",
            "A",
            "B",
            "change",
            "finding",
            title="findings that changed",
            title_justify="left",
        )
        for f in c.findings:
            t.add_row(f.check, f.severity_a or "–", f.severity_b or "–", f.status, escape(f.title))
        out.print(fit(t, out))
    else:
        out.print("findings: the same in both runs")
    for f in c.triage.findings:
        if f.step >= 6 and f.severity != "info":
            out.print(f"{severity(f.severity)} step {f.step}: {escape(f.title)}", highlight=False)
        elif f.check in ("tp-scaling", "pp-scaling"):  # why a layout change helped or not
            out.print(f"[bold]scaling (step 4)[/]: {escape(f.title)}\n{escape(f.explanation)}",
                      highlight=False)  # fmt: skip
