"""results/report.md: the triage as a document, with PNG figures beside it.

Written by `perfdiag analyze`: the verdict (top cause), the gate, each finding with its
evidence table, the ids of the worst requests or steps, what to try, and the figures the
playbook points to; then every triage step with what it could not evaluate and why, and
the symptoms. Figures are the ones the fired findings name (the TTFT critical path and
the load over time when none fired).
"""

from __future__ import annotations

from pathlib import Path

from ..analyzers.findings import Finding, Triage
from ..traces.atomic_file import write_atomic
from ..traces.layout import RESULTS_DIR
from .figures import draw
from .triage_view import GATE_HEADING, triage_view

REPORT_FILE = "report.md"
OVERVIEW_FIGURES = ("ttft_parts", "load")


def write_report(triage: Triage, ctx, figures: bool = True) -> Path:
    results = Path(ctx.run.path) / RESULTS_DIR
    results.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, str] = {}
    if figures:
        wanted = [n for f in triage.findings if f.severity != "info" for n in f.figures]
        for name in dict.fromkeys(wanted or OVERVIEW_FIGURES):
            path = draw(name, ctx, results)
            if path is not None:
                drawn[name] = path.name
    target = results / REPORT_FILE
    return write_atomic(target, render(triage, ctx, drawn))


def render(triage: Triage, ctx, figures: dict[str, str]) -> str:
    s = ctx.serving
    lines = [f"# perfdiag report: {triage.run_id}", ""]
    window = s.window
    lines.append(
        f"Run `{triage.run_path}` · status {ctx.run.status} · {s.basis or 'no'} view"
        + (
            f" · window {window.duration_s:.2f} s ({window.reason})"
            if hasattr(window, "duration_s")
            else ""
        )
    )
    if triage.baseline:
        lines.append(f"Baseline: {triage.baseline}")
    view = triage_view(triage)
    top = view.top
    lines += ["", "## Verdict", ""]
    lines.append(
        f"**Top cause: {view.verdict}** ({top.severity}, step {top.step})"
        if top
        else f"Top cause: {view.verdict}."
    )
    lines += [
        "",
        f"## {GATE_HEADING}",
        "",
        view.gate_summary[0].upper() + view.gate_summary[1:] + ".",
    ]
    for f in view.qualifiers:
        lines += _finding(f, figures)
    lines += ["", "## Findings, ranked", ""]
    rest = [f for f in triage.findings if f.step > 1]
    if not rest:
        lines.append("None.")
    placed: set[str] = set()
    for f in rest:
        lines += _finding(f, {k: v for k, v in figures.items() if k not in placed})
        placed.update(f.figures)
    if not any(f.figures for f in triage.findings if f.severity != "info"):
        lines += [f"![{n}]({p})" for n, p in figures.items()]
    lines += [
        "",
        "## Triage steps",
        "",
        "| step | title | status | checks | not evaluated because |",
        "|---|---|---|---|---|",
    ]
    for st in view.steps:
        why = "; ".join(f"{', '.join(f'`{c}`' for c in cs)}: {r}" for r, cs in st.not_evaluated)
        lines.append(
            f"| {st.step} | {_cell(st.title)} | {st.status_text} | {st.counts.text()} "
            f"| {_cell(why or '')} |"
        )
    if triage.applicability:  # a bare trace: the serving-only checks, said once
        lines += ["", f"{triage.applicability.capitalize()}: "
                  + ", ".join(f"`{c}`" for c in triage.not_applicable) + "."]  # fmt: skip
    lines += ["", "## Checks", ""]
    for st in view.steps:
        lines += ["", f"Step {st.step} ({st.status_text}):", ""]
        lines += [f"- `{o.check}` {_cell(o.text())}" for o in st.outcomes]
    lines += ["", "## Symptoms", "", "| symptom | present | explained by |", "|---|---|---|"]
    for sc in triage.scenarios:
        why = ", ".join(f"`{c}`" for c in sc.explained_by) or "–"
        lines.append(f"| {sc.title} | {sc.symptom} | {why} |")
    return "\n".join(lines) + "\n"


def _finding(f: Finding, figures: dict[str, str]) -> list[str]:
    follows = f" — {f.cause[0]} `{f.cause[1]}`" if f.cause else ""
    lines = [
        "",
        f"### {f.rank}. [{f.severity}] {f.title}",
        "",
        f"Step {f.step} ({f.step_title}) · check `{f.check}`{follows}",
        "",
        f.explanation,
    ]
    if f.evidence and f.severity != "info":
        lines += ["", "| evidence | value |", "|---|---|"]
        lines += [f"| {_cell(e.label)} | {_cell(e.text())} |" for e in f.evidence]
    for ids in f.ids:
        lines += [
            "",
            f"{ids.kind.capitalize()}s, {ids.label}: " + ", ".join(f"`{i}`" for i in ids.ids),
        ]
    if f.recommendations:
        lines += ["", "What to try:"] + [f"- {r}" for r in f.recommendations]
    for name in f.figures:
        if name in figures:
            lines += ["", f"![{name}]({figures[name]})"]
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
