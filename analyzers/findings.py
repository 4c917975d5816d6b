"""Findings: what the triage concluded, as data that the CLI, the TUI and the exports render.

A finding is one check of a playbook that fired: its triage step, severity, a title with
numbers, the evidence (named numbers, the worst requests or steps by id, figures), a
plain-language explanation and what to try next. The triage also keeps, per step, the
outcome of every check (fired, passed, not evaluated and why), so a reader sees what was
looked at, not only what went wrong. `results/findings.json` is `to_jsonable(triage)`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..traces.atomic_file import write_atomic
from ..traces.layout import RESULTS_DIR
from .actions import Action
from .serving import to_jsonable

FINDINGS_FILE = "findings.json"
SEVERITIES = ("info", "warning", "critical")  # in increasing order
GATE_STEP = 0  # the data-trust gate, reported before the seven steps
QUALIFYING_STEP = 1  # the gate and step 1 (reproducibility) qualify the causes after them


def recorded_analysis(run_path: str | os.PathLike) -> dict | None:
    """The options of the analysis results/findings.json holds (None: none recorded)."""
    try:
        data = json.loads((Path(run_path) / RESULTS_DIR / FINDINGS_FILE).read_text())
    except (OSError, ValueError):
        return None
    analysis = data.get("analysis") if isinstance(data, dict) else None
    return analysis if isinstance(analysis, dict) else None


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


@dataclass(frozen=True)
class Evidence:
    name: str  # the key a playbook's text refers to
    label: str
    value: float | int | str | bool | None
    unit: str = ""  # ms, s, %, req/s, tokens, … ("" for counts and text); % values are shares

    def text(self) -> str:
        """The value as people read it: 0.42 with unit % is "42%", 12.345 ms "12.3 ms"."""
        return value_text(self.value, self.unit)


NOT_MEASURED = "not measured"


def value_text(v, unit: str = "", signed: bool = False) -> str:
    """perfdiag's one way of writing a value: 0.42 with unit % is "42%", 12.345 ms
    "12.3 ms", 1163.67 "1,164"; `signed` writes a "+" on positive numbers (deltas);
    missing (None, NaN) is "not measured". The CLI, the TUI and report.md use it."""
    if v is None or (isinstance(v, float) and v != v):
        return NOT_MEASURED
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    sign = "+" if signed and v > 0 else ""
    if unit == "%":
        p = v * 100
        if p == 0:
            return "0%"
        if abs(p) < 0.01:  # rounding noise, or nearly none: never "1.6e-13%"
            return f"{'−' if p < 0 else ''}<0.01%"
        if abs(p) < 0.1:
            return f"{sign}{p:.2g}%"
        return f"{sign}{p:.1f}%" if abs(p) < 10 else f"{sign}{p:,.0f}%"
    number = f"{v:,}" if isinstance(v, int) else number_text(v)
    return f"{sign}{number} {unit}".strip()


def number_text(v: float) -> str:
    """A number with about three significant figures, thousands separated."""
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


@dataclass(frozen=True)
class IdList:
    kind: str  # request | step
    label: str  # what makes them worst, e.g. "longest input processing"
    ids: tuple[str, ...]


@dataclass(frozen=True)
class Finding:
    check: str  # the playbook check's id
    step: int  # 0 = the gate, 1..7 = the triage steps
    step_title: str
    severity: str  # info | warning | critical
    title: str
    explanation: str
    recommendations: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    ids: tuple[IdList, ...]
    figures: tuple[str, ...]
    value: float | int | str | bool | None
    impact: float  # 0..1: the share of the problem this finding explains
    consequence_of: str | None = None  # a fired check this one follows from
    rank: int = 0  # 1 = the top finding
    action: Action | None = None  # the first recommendation as a change a re-run can apply
    # a fired root that explains part of it, not all (a neighbour's share of the time)
    in_part_from: str | None = None

    @property
    def cause(self) -> tuple[str, str] | None:
        """("follows from", check) or ("in part from", check): what the terminal and the
        reports print beside the check; None for a finding of its own."""
        if self.consequence_of:
            return "follows from", self.consequence_of
        if self.in_part_from:
            return "in part from", self.in_part_from
        return None


@dataclass(frozen=True)
class CheckOutcome:
    check: str
    status: str  # fired | passed | not-evaluated
    value: float | int | str | bool | None = None
    reason: str = ""  # not evaluated: what the run lacks
    severity: str | None = None  # fired: at which severity
    measure: str = ""  # what the value is ("requests measured": playbooks/check_values.py)
    unit: str = ""  # the value's unit, as Evidence's ("%" for shares)
    op: str = ""  # where the check starts to fire: `value op threshold` (at_least, in, …)
    threshold: float | int | str | bool | list | None = None  # its mildest level


@dataclass(frozen=True)
class StepResult:
    step: int
    title: str
    status: str  # fired | partial | pass | not-evaluated (playbooks/triage_view.step_status)
    checks: tuple[CheckOutcome, ...]

    @property
    def not_evaluated(self) -> tuple[CheckOutcome, ...]:
        return tuple(c for c in self.checks if c.status == "not-evaluated")


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    title: str
    symptom: str  # present | absent | unknown
    value: float | int | str | bool | None
    explained_by: tuple[str, ...]  # fired checks on its route, in rank order
    reason: str = ""


@dataclass(frozen=True)
class Triage:
    run_id: str
    run_path: str
    playbook: str
    findings: tuple[Finding, ...]  # ranked: the gate first, then causes, consequences, info
    steps: tuple[StepResult, ...]
    scenarios: tuple[ScenarioResult, ...]
    baseline: str | None = None  # run id of the baseline (steps 6 and 7), if any
    # a bare trace: the serving-only checks taken out of the steps, and why (said once)
    not_applicable: tuple[str, ...] = ()
    applicability: str = ""  # "not applicable to a training trace", or "" (serving run)

    @property
    def qualifiers(self) -> tuple[Finding, ...]:
        """Findings of the gate (can the data be trusted?) and of step 1 (can the run be
        reproduced?): they qualify every cause."""
        return tuple(f for f in self.findings if f.step <= QUALIFYING_STEP)

    @property
    def causes(self) -> tuple[Finding, ...]:
        """Warnings and critical findings of steps 2 to 7, root causes first."""
        return tuple(f for f in self.findings if f.step > QUALIFYING_STEP and f.severity != "info")

    @property
    def top(self) -> Finding | None:
        """The top cause: the highest-ranked warning or critical finding of steps 2-7."""
        return next(iter(self.causes), None)

    def by_check(self, check: str) -> Finding | None:
        return next((f for f in self.findings if f.check == check), None)


def write_findings(
    triage: Triage, run_path: str | os.PathLike, analysis: dict | None = None
) -> Path:
    """Write results/findings.json into the run (atomically: write, then rename);
    `analysis`: the options it was made with (`perfdiag analyze` records them, so a later
    analysis with other options can say what it replaces)."""
    results = Path(run_path) / RESULTS_DIR
    results.mkdir(parents=True, exist_ok=True)
    target = results / FINDINGS_FILE
    data = to_jsonable(triage)
    data["top"] = triage.top.check if triage.top is not None else None  # the top cause's check
    if analysis is not None:
        data["analysis"] = analysis
    write_atomic(target, json.dumps(data, indent=2) + "\n")
    return target
