"""Findings on the terminal: the triage in order, top cause first, with its evidence.

Shared by `perfdiag analyze` and `perfdiag compare`; formats only: the findings are
data (analyzers/findings.py), and the steps' status, counts and outcomes come from the
view the TUI and report.md render too (playbooks/triage_view.py).
"""

from __future__ import annotations

from rich.markup import escape

from ..playbooks.triage_view import GATE_HEADING, triage_view
from .app import out

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
STEP_STYLE = {"fired": "red", "pass": "green", "partial": "yellow", "not-evaluated": "dim"}


def severity(s: str) -> str:
    return f"[{SEVERITY_STYLE.get(s, '')}]{s.upper()}[/]"


def print_triage(
    triage, scenario: str | None = None, details: bool = True, checks: bool = False
) -> None:
    """Qualifiers (data trust, reproducibility), the top cause, the ranked findings of
    steps 2-7 (those on `scenario`'s route first), the steps (with `checks`, every passed
    check's value against its threshold), the symptoms."""
    view = triage_view(triage)
    out.print(f"[bold]{GATE_HEADING}[/]: {escape(view.gate_summary)}", highlight=False)
    for f in view.qualifiers:
        _finding(f, details)
    top = view.top
    if top is None:
        out.print(f"[bold]Top cause[/]: [green]{escape(view.verdict)}[/]", highlight=False)
    else:
        out.print(f"[bold]Top cause[/]: {severity(top.severity)} {escape(view.verdict)}")
    findings = [f for f in triage.findings if f.step > 1]
    if scenario is not None:
        s = next(x for x in triage.scenarios if x.scenario == scenario)
        on_route = [f for f in findings if f.check in s.explained_by]
        out.print(
            f"\n[bold]{escape(s.title)}[/] ({s.symptom}): {len(on_route)} finding(s) on its route"
        )
        findings = on_route + [f for f in findings if f not in on_route]
    out.print()
    for f in findings:
        if f.severity == "info" and not details:
            continue
        _finding(f, details)
    _steps(view, checks)
    _symptoms(triage)


def _finding(f, details: bool) -> None:
    follows = f" [dim]({' '.join(f.cause)})[/]" if f.cause else ""
    out.print(
        f"[bold]{f.rank:>2}[/] {severity(f.severity)} [dim]step {f.step} · {f.check}[/]"
        f"{follows}\n   {escape(f.title)}",
        highlight=False,
    )
    if f.severity == "info" or not details:
        return
    ev = "; ".join(f"{e.label} {e.text()}" for e in f.evidence)
    out.print(f"   [dim]evidence:[/] {escape(ev)}", highlight=False)
    for ids in f.ids:
        out.print(
            f"   [dim]{ids.kind}s, {escape(ids.label)}:[/] {', '.join(ids.ids)}", highlight=False
        )
    for r in f.recommendations[:2]:
        out.print(f"   [green]try:[/] {escape(r)}", highlight=False)
    if f.action is not None and f.action.kind == "run":
        out.print(
            f"   [dim]check it: perfdiag analyze RUN --verify-advice --finding {f.check} "
            f"(re-runs with {escape(f.action.flags)})[/]",
            highlight=False,
        )


def _steps(view, checks: bool = False) -> None:
    out.print("\n[bold]Triage steps[/]")
    for s in view.steps:
        style = STEP_STYLE[s.status] if s.worst != "warning" else "yellow"
        status = f"[{style}]{s.status_text}[/]"
        out.print(
            f" {s.step} {escape(s.title)} — {status}: [dim]{s.counts.text()}[/]", highlight=False
        )
        for o in s.outcomes if checks else ():
            if o.status == "passed":
                out.print(f"   [dim]{o.check} {escape(o.text())}[/]", highlight=False)
        for reason, names in s.not_evaluated:
            out.print(
                f"   [dim]not evaluated: {', '.join(names)} — {escape(reason)}[/]", highlight=False
            )


def _not_applicable(triage) -> None:
    """A bare trace: the serving-only steps, checks and symptoms, said once."""
    if not triage.applicability:
        return
    n = len(triage.not_applicable)
    symptoms = [s.title for s in triage.scenarios if s.symptom == "not-applicable"]
    text = f"{n} serving check{'s' * (n != 1)}"
    if symptoms:
        text += f" and the symptoms {', '.join(symptoms)}"
    gone = [str(k) for k in range(8) if k not in {s.step for s in triage.steps}]
    if gone:
        text += f" (all of step{'s' * (len(gone) > 1)} {', '.join(gone)})"
    out.print(f"[dim]{escape(triage.applicability)}: {escape(text)}[/]", highlight=False)


def _symptoms(triage) -> None:
    _not_applicable(triage)
    present = [s for s in triage.scenarios if s.symptom == "present"]
    if not present:
        absent = [s.title for s in triage.scenarios if s.symptom == "absent"]
        unknown = [s.title for s in triage.scenarios if s.symptom == "unknown"]
        text = f"none of {', '.join(absent)}" if absent else "none seen"
        if unknown:
            text += f"; cannot tell: {', '.join(unknown)}"
        out.print(f"[dim]symptoms: {text}[/]")
        return
    for s in present:
        why = ", ".join(s.explained_by) or "no finding on its route explains it"
        out.print(f"[bold]symptom[/]: {escape(s.title)} → {escape(why)}", highlight=False)
