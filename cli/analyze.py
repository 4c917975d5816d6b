"""`perfdiag analyze RUN`: the triage — data trust first, then the seven steps, the top
cause first with its evidence — over the serving analyses; writes results/metrics.json,
results/findings.json and results/report.md (with PNG figures) into the run.
`--details` adds the analyses' tables (metrics, TTFT critical path, ITL attribution,
load checks, scheduler, cache)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from .app import app, out
from .triage_options import Baseline, FullRun, Playbook, Slo, SloFile


@app.command()
def analyze(
    run: Annotated[Path, typer.Argument(help="A run directory.")],
    slo: Slo = None,
    slo_file: SloFile = None,
    full_run: FullRun = False,
    details: Annotated[
        bool, typer.Option("--details", help="Also print every analysis as tables.")
    ] = False,
    scenario: Annotated[
        str | None,
        typer.Option(
            help="Focus on a symptom: high-ttft, itl-spikes, low-throughput, "
            "preemption-storm, multi-gpu-scaling."
        ),
    ] = None,
    repeat: Annotated[
        list[Path] | None,
        typer.Option(help="A repeat of this run's configuration (step 1 measures the noise)."),
    ] = None,
    baseline: Baseline = None,
    playbook: Playbook = None,
    no_report: Annotated[
        bool, typer.Option("--no-report", help="Do not write report.md and its figures.")
    ] = False,
    html: Annotated[
        bool,
        typer.Option("--html", help="Also write results/report.html (perfdiag report RUN)."),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print metrics.json (findings are in findings.json).")
    ] = False,
    verify_advice: Annotated[
        bool,
        typer.Option(
            "--verify-advice",
            help="Apply the top finding's advice (perfdiag run --like RUN with its options), "
            "re-run, and compare the metric its check targets (fixed in the playbook).",
        ),
    ] = False,
    finding: Annotated[
        str | None,
        typer.Option(help="With --verify-advice: this check's advice instead of the top one."),
    ] = None,
    verify_out: Annotated[
        Path | None,
        typer.Option(help="With --verify-advice: the re-run's directory [RUN-verify-CHECK]."),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats",
            min=1,
            help="With --verify-advice: runs a side (the run is one of the first side; the "
            "others re-run its options and seed), judged by an interval over runs; 1: one "
            "re-run judged by requests alone. [default: 3]",
        ),
    ] = None,
) -> None:
    """Triage a run: what is wrong, with evidence, and what to try next."""
    from ..analyzers.findings import write_findings
    from ..analyzers.serving import analyze_serving, to_jsonable, write_metrics
    from ..errors import ConfigError
    from ..playbooks.facts import TriageContext
    from .analyze_tables import print_header, print_missing, print_tables
    from .findings_view import print_triage
    from .server_view import print_server_record

    if (finding or verify_out or repeats) and not verify_advice:
        raise ConfigError("--finding, --verify-out and --repeats go with --verify-advice")
    if html and no_report:
        raise ConfigError("--html writes a report: drop --no-report")
    ctx, triage, target = triage_of(
        run, slo, slo_file, full_run, repeat, baseline, playbook, scenario
    )
    loaded, result = ctx.run, ctx.serving
    options = analysis_options(slo, slo_file, full_run, repeat, baseline, playbook)
    replaced = _replaced_note(loaded.path, options, no_report)
    written = _write(
        lambda: write_metrics(result, loaded.path),
        lambda: write_findings(triage, loaded.path, options),
        (lambda: _report(triage, ctx)) if not no_report else None,
        (lambda: _html(triage, ctx)) if html else None,
    )
    if as_json:
        print(json.dumps(to_jsonable(result), indent=2))
        return
    print_header(result)
    print_triage(triage, scenario, checks=details)
    if not triage.applicability:  # a bare trace was told once what does not apply to it
        print_missing(result)
    if details:
        print_tables(result)
        print_server_record(ctx)
    if written:
        out.print(f"written: {', '.join(str(p) for p in written)}", highlight=False)
    for note in replaced:
        out.print(f"[yellow]note[/]: {note}", highlight=False)
    if verify_advice:
        from .verify_view import verify_and_print

        def analyze_again(run):
            return TriageContext(run, analyze_serving(run, target, steady=not full_run))

        verify_and_print(ctx, triage, finding, verify_out, analyze_again, repeats or 3)


def analysis_options(slo, slo_file, full_run, repeat, baseline, playbook) -> dict:
    """What an analysis was asked, as findings.json records it (defaults left out)."""
    options = {
        "window": "whole run" if full_run else "steady state",
        "slo": slo or (str(slo_file) if slo_file else None),
        "repeats": [str(p) for p in repeat or ()] or None,
        "baseline": str(baseline) if baseline else None,
        "playbook": str(playbook) if playbook else None,
    }
    return {k: v for k, v in options.items() if v is not None}


def _describe(options: dict) -> str:
    parts = [options.get("window", "steady state")]
    for key in ("slo", "baseline", "repeats", "playbook"):
        if key in options:
            value = options[key]
            parts.append(f"{key} {', '.join(value) if isinstance(value, list) else value}")
    return "; ".join(parts)


def _replaced_note(run_path: Path, options: dict, no_report: bool) -> list[str]:
    """Say when this analysis replaces one made with other options (findings.json and
    metrics.json hold the latest), and when report.md is left from an earlier one."""
    from ..analyzers.findings import recorded_analysis
    from ..traces.layout import RESULTS_DIR

    notes = []
    before = recorded_analysis(run_path)
    if before is not None and before != options:
        notes.append(f"results/findings.json and metrics.json held an analysis over "
                     f"{_describe(before)}; now over {_describe(options)}")  # fmt: skip
    report = Path(run_path) / RESULTS_DIR / "report.md"
    if no_report and report.exists() and before != options:
        notes.append("results/report.md is from an earlier analysis (--no-report left it): "
                     "run analyze without --no-report to bring it up to date")  # fmt: skip
    return notes


def triage_of(run, slo=None, slo_file=None, full_run=False, repeat=None, baseline=None,
              playbook=None, scenario=None):  # fmt: skip
    """The run's triage context, its triage and the SLO it was judged against, as
    `analyze` builds them from its options (`perfdiag report` shares it)."""
    from ..analyzers.serving import analyze_serving
    from ..analyzers.slo import load_slo_file, parse_slo
    from ..errors import ConfigError
    from ..playbooks.evaluate import run_triage
    from ..playbooks.facts import TriageContext
    from ..playbooks.schema import load_playbook, load_scenarios
    from ..traces.reader import load_run

    if slo and slo_file:
        raise ConfigError("give --slo or --slo-file, not both")
    target = parse_slo(slo) if slo else load_slo_file(slo_file) if slo_file else None
    book = load_playbook(playbook)
    scenarios = load_scenarios(book)
    if scenario is not None and scenario not in {s.id for s in scenarios}:
        raise ConfigError(
            f"unknown scenario {scenario!r}; choose one of {', '.join(s.id for s in scenarios)}"
        )
    loaded = load_run(run)
    result = analyze_serving(loaded, target, steady=not full_run)

    def context(path: Path) -> TriageContext:
        other = load_run(path)
        return TriageContext(other, analyze_serving(other, target, steady=not full_run))

    ctx = TriageContext(
        loaded,
        result,
        repeats=tuple(context(p) for p in repeat or ()),
        baseline=context(baseline) if baseline is not None else None,
    )
    return ctx, run_triage(ctx, book, scenarios), target


def _html(triage, ctx):
    from ..playbooks.html_report import write_html

    return write_html(triage, ctx)


def _report(triage, ctx):
    from ..playbooks.report import write_report

    return write_report(triage, ctx)


def _write(*writers) -> list[Path]:
    """Run each writer; a run directory we cannot write to is a warning, not a failure."""
    done = []
    for write in writers:
        if write is None:
            continue
        try:
            done.append(write())
        except OSError as e:
            print(f"perfdiag: warning: could not write results ({e.strerror})", file=sys.stderr)
    return done
