"""The triage's state as people read it, one model for every renderer.

`perfdiag analyze` (cli/findings_view.py), the TUI (tui/screens/overview.py, checks.py)
and report.md (playbooks/report.py) all render a `TriageView`, so they cannot disagree
on a step's status, its counts, an outcome's value or the verdict. The text here is
plain (no markup): renderers add colour, never words or numbers.

A step's status, the one rule (`step_status`), first that holds:
- **fired**: a check of the step fired at warning or critical;
- **not-evaluated**: no check of the step could be evaluated (or it has none);
- **partial**: some checks could not be evaluated, and those that were found no problem;
- **pass**: every check was evaluated and none fired at warning or critical.
Informational findings never make a step fire: they are counted (`fired`, `info`) and
shown, and a step whose checks all ran with only notes passes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..analyzers.findings import (
    QUALIFYING_STEP,
    CheckOutcome,
    Finding,
    Triage,
    value_text,
)

STATUSES = ("fired", "partial", "pass", "not-evaluated")
PROBLEM = ("warning", "critical")
GATE_HEADING = "Data and reproducibility (steps 0 and 1)"
OPS = {"at_least": "≥", "above": ">", "at_most": "≤", "below": "<"}


def step_status(checks: Iterable[CheckOutcome]) -> str:
    """fired | not-evaluated | partial | pass, by the rule in the module's docstring."""
    checks = tuple(checks)
    if any(c.status == "fired" and c.severity in PROBLEM for c in checks):
        return "fired"
    missing = sum(c.status == "not-evaluated" for c in checks)
    if missing == len(checks):
        return "not-evaluated"
    return "partial" if missing else "pass"


def status_text(status: str) -> str:
    return status.replace("-", " ")


@dataclass(frozen=True)
class Counts:
    passed: int = 0
    critical: int = 0
    warning: int = 0
    info: int = 0
    not_evaluated: int = 0

    @property
    def fired(self) -> int:
        return self.critical + self.warning + self.info

    def text(self) -> str:
        """ "4 passed, 2 fired (1 warning, 1 info), 2 not evaluated": zeros left out, but
        the passed count always shown."""
        parts = [f"{self.passed} passed"]
        if self.fired:
            by = ((self.critical, "critical"), (self.warning, "warning"), (self.info, "info"))
            parts.append(f"{self.fired} fired ({', '.join(f'{n} {s}' for n, s in by if n)})")
        if self.not_evaluated:
            parts.append(f"{self.not_evaluated} not evaluated")
        return ", ".join(parts)

    def short(self) -> str:
        """The same counts for a narrow column: "4 ok · 2 fired · 2 n/e"."""
        parts = [f"{self.passed} ok"]
        if self.fired:
            parts.append(f"{self.fired} fired")
        if self.not_evaluated:
            parts.append(f"{self.not_evaluated} n/e")
        return " · ".join(parts)


@dataclass(frozen=True)
class OutcomeView:
    check: str
    status: str  # fired | passed | not-evaluated
    severity: str | None  # fired: at which severity
    measure: str  # what the value is ("requests measured")
    value: str  # the value with its unit, or "not measured"
    threshold: str  # "fires at ≥ 10%" ("" when the check is unknown)
    reason: str  # not evaluated: what the run lacks
    title: str  # fired: the finding's title

    @property
    def value_text(self) -> str:
        """ "TTFT growth per second of load 0.00453 s/s (fires at ≥ 0.1 s/s)"."""
        text = f"{self.measure} {self.value}".strip()
        return f"{text} ({self.threshold})" if self.threshold else text

    def text(self) -> str:
        """The outcome on one line, without its check id."""
        if self.status == "fired":
            return f"{self.severity}: {self.title}"
        if self.status == "passed":
            return f"passed: {self.value_text}"
        return f"not evaluated: {self.reason}"


@dataclass(frozen=True)
class StepView:
    step: int
    title: str
    status: str  # fired | partial | pass | not-evaluated
    worst: str | None  # the worst severity that fired (info included), None if none
    counts: Counts
    outcomes: tuple[OutcomeView, ...]

    @property
    def status_text(self) -> str:
        return status_text(self.status)

    @property
    def not_evaluated(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(reason, checks) for the checks that could not run, grouped by reason."""
        by: dict[str, list[str]] = {}
        for o in self.outcomes:
            if o.status == "not-evaluated":
                by.setdefault(o.reason, []).append(o.check)
        return tuple((r, tuple(c)) for r, c in by.items())


@dataclass(frozen=True)
class TriageView:
    steps: tuple[StepView, ...]
    top: Finding | None  # the top cause (steps 2-7)
    qualifiers: tuple[Finding, ...]  # the findings of steps 0 and 1
    problems: int  # warnings and critical findings, all steps
    notes: int  # informational findings, all steps

    def step(self, number: int) -> StepView | None:
        return next((s for s in self.steps if s.step == number), None)

    @property
    def verdict(self) -> str:
        """The top cause without its severity (renderers style that), or why there is none."""
        if self.top is not None:
            return self.top.title
        if self.problems:
            return "none in steps 2–7; steps 0 and 1 qualify the run (below)"
        return "none — no warning or critical finding in any step"

    @property
    def gate_summary(self) -> str:
        """What steps 0 and 1 found, in one line: never "no problem" beside a problem."""
        serious = [f for f in self.qualifiers if f.severity in PROBLEM]
        notes = len(self.qualifiers) - len(serious)
        n = len(serious)
        if n:
            verb = "qualifies" if n == 1 else "qualify"
            text = f"{n} problem{'s' * (n != 1)} that {verb} every finding after them"
        else:
            text = "no data or reproducibility problem"
        return text + (f"; {notes} info finding{'s' * (notes != 1)}" if notes else "")


def triage_view(triage: Triage) -> TriageView:
    steps = []
    for s in triage.steps:
        outcomes = tuple(_outcome(c, triage.by_check(c.check)) for c in s.checks)
        fired = [c.severity for c in s.checks if c.status == "fired"]
        counts = Counts(
            passed=sum(c.status == "passed" for c in s.checks),
            critical=fired.count("critical"),
            warning=fired.count("warning"),
            info=fired.count("info"),
            not_evaluated=sum(c.status == "not-evaluated" for c in s.checks),
        )
        worst = next((v for v in ("critical", "warning", "info") if v in fired), None)
        steps.append(StepView(s.step, s.title, step_status(s.checks), worst, counts, outcomes))
    return TriageView(
        steps=tuple(steps),
        top=triage.top,
        qualifiers=tuple(f for f in triage.findings if f.step <= QUALIFYING_STEP),
        problems=sum(f.severity in PROBLEM for f in triage.findings),
        notes=sum(f.severity == "info" for f in triage.findings),
    )


def _outcome(c: CheckOutcome, finding: Finding | None) -> OutcomeView:
    evaluated = c.status != "not-evaluated"
    return OutcomeView(
        check=c.check,
        status=c.status,
        severity=c.severity,
        measure=c.measure,
        value=value_text(c.value, c.unit) if evaluated else "",
        threshold=threshold_text(c.op, c.threshold, c.unit) if evaluated else "",
        reason=c.reason,
        title=finding.title if finding is not None else "",
    )


def threshold_text(op: str, threshold, unit: str) -> str:
    """Where a check starts to fire: "fires at ≥ 10%", "fires when crashed or running"."""
    if not op or threshold is None:
        return ""
    if op in OPS:
        return f"fires at {OPS[op]} {value_text(threshold, unit)}"
    if op == "in" and isinstance(threshold, list | tuple):
        *first, last = [str(t) for t in threshold] or [""]
        return "fires when " + (f"{', '.join(first)} or {last}" if first else last)
    return f"fires when {value_text(threshold, unit)}"
