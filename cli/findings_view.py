"""Findings on the terminal: the triage in order, top cause first, with its evidence.

Shared by `perfdiag analyze` and `perfdiag compare`; formats only (the findings are
data, analyzers/findings.py).
"""

from __future__ import annotations

from rich.markup import escape

from .app import out

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
STEP_STYLE = {"findings": "red", "ok": "green", "partial": "yellow", "not-evaluated": "dim"}


def severity(s: str) -> str:
    return f"[{SEVERITY_STYLE.get(s, '')}]{s.upper()}[/]"


def print_triage(triage, scenario: str | None = None, details: bool = True) -> None:
    """Qualifiers (data trust, reproducibility), the top cause, the ranked findings of
    steps 2-7 (those on `scenario`'s route first), the steps, the symptoms."""
    quals = triage.qualifiers
    problems = [f for f in quals if f.severity != "info"]
    head = (
        f"{len(problems)} problem(s) qualify what follows" if problems else "[green]no problem[/]"
    )
    out.print(f"[bold]Data and reproducibility[/] (gate, step 1): {head}")
    for f in quals:
        _finding(f, details)
    top = triage.top
    if top is None:
        out.print(
            "[bold]Top cause[/]: [green]none[/] — no warning or critical finding in steps 2–7"
        )
    else:
        out.print(f"[bold]Top cause[/]: {severity(top.severity)} {escape(top.title)}")
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
    _steps(triage)
    _symptoms(triage)


def _finding(f, details: bool) -> None:
    follows = f" [dim](follows from {f.consequence_of})[/]" if f.consequence_of else ""
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


def _steps(triage) -> None:
    out.print("\n[bold]Triage steps[/]")
    for s in triage.steps:
        found = sum(c.status == "fired" and c.severity != "info" for c in s.checks)
        notes = sum(c.status == "fired" and c.severity == "info" for c in s.checks)
        passed = sum(c.status == "passed" for c in s.checks)
        counts = f"{found} finding(s), {passed} passed" + (f", {notes} note(s)" if notes else "")
        status = f"[{STEP_STYLE[s.status]}]{s.status}[/]"
        out.print(f" {s.step} {escape(s.title)} — {status} [dim]({counts})[/]", highlight=False)
        by_reason: dict[str, list[str]] = {}
        for c in s.not_evaluated:
            by_reason.setdefault(c.reason, []).append(c.check)
        for reason, checks in by_reason.items():
            out.print(
                f"   [dim]not evaluated: {', '.join(checks)} — {escape(reason)}[/]", highlight=False
            )


def _symptoms(triage) -> None:
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
