"""Walk a playbook over a run: every check's fact, its condition, the findings, ranked.

Ranking says what to fix first:
1. qualifiers: the gate's findings (data-trust problems) and step 1's (the run cannot be
   reproduced, or its repeats are noisy) — they qualify everything after them;
2. root causes: warnings and critical findings that no other fired finding explains,
   most severe first (a root counts as severe as the worst finding it explains), then
   by impact (the share of the problem they explain), then in triage order;
3. consequences: findings explained by a fired root (`consequence_of` in the playbook),
   kept with the root they follow from — a queue that grows because the KV pool thrashes
   is real, but the pool is what to fix;
4. informational findings.
"""

from __future__ import annotations

from ..analyzers.findings import (
    QUALIFYING_STEP,
    CheckOutcome,
    Finding,
    ScenarioResult,
    StepResult,
    Triage,
    severity_rank,
)
from . import applicability, template
from .check_values import measure
from .facts import Fact, TriageContext, Unavailable, evaluate_fact
from .schema import Check, Playbook, Scenario, load_playbook, load_scenarios
from .triage_view import step_status


def run_triage(
    ctx: TriageContext,
    playbook: Playbook | None = None,
    scenarios: tuple[Scenario, ...] | None = None,
) -> Triage:
    playbook = playbook or load_playbook()
    if scenarios is None:
        scenarios = load_scenarios(playbook)
    findings: list[Finding] = []
    steps: list[StepResult] = []
    for step in playbook.steps:
        outcomes = []
        for check in step.checks:
            result = evaluate_fact(check.fact, ctx, dict(check.params))
            label, unit = measure(check.fact, dict(check.params))
            mildest = check.condition.levels[0][1] if check.condition.levels else None
            how = {"measure": label, "unit": unit, "op": check.condition.op, "threshold": mildest}
            if isinstance(result, Unavailable):
                outcomes.append(
                    CheckOutcome(check.id, "not-evaluated", reason=result.reason, **how)
                )
                continue
            severity = check.condition.severity(result.value)
            if severity is not None and result.max_severity is not None:
                severity = min(severity, result.max_severity, key=severity_rank)
            status = "passed" if severity is None else "fired"
            outcomes.append(
                CheckOutcome(check.id, status, _plain(result.value), "", severity, **how)
            )
            if severity is not None:
                findings.append(_finding(check, step.step, step.title, severity, result))
        steps.append(_step_result(step.step, step.title, outcomes))
    ranked = _rank(findings, playbook)
    triage = Triage(
        run_id=ctx.run.manifest.run_id,
        run_path=str(ctx.run.path),
        playbook=playbook.name,
        findings=ranked,
        steps=tuple(steps),
        scenarios=tuple(_scenario(s, ctx, ranked) for s in scenarios),
        baseline=ctx.baseline.run.manifest.run_id if ctx.baseline is not None else None,
    )
    check_facts = {c.id: c.fact for step in playbook.steps for c in step.checks}
    symptom_facts = {s.id: s.symptom_fact for s in scenarios}
    return applicability.apply(triage, ctx.run, check_facts, symptom_facts)


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def _finding(check: Check, step: int, step_title: str, severity: str, fact: Fact) -> Finding:
    values = fact.values()
    evidence = fact.evidence
    if check.evidence is not None:
        evidence = tuple(e for e in evidence if e.name in check.evidence)
    return Finding(
        check=check.id,
        step=step,
        step_title=step_title,
        severity=severity,
        title=template.render(check.title, values),
        explanation=template.render(check.explanation, values).strip(),
        # A recommendation that renders empty (advice the run gives no ground for) is left out.
        recommendations=tuple(
            r for r in (template.render(t, values).strip() for t in check.next) if r
        ),
        evidence=evidence,
        ids=tuple(i for i in fact.ids if i.ids),
        figures=check.figures,
        value=_plain(fact.value),
        impact=float(fact.impact) if fact.impact == fact.impact else 0.0,
        action=_fixed_target(fact.action, check.verify),
    )


def _fixed_target(action, target: str | None):
    # The playbook's target wins: the metric to judge advice by is chosen before any run.
    if action is None or target is None or action.target == target:
        return action
    from dataclasses import replace

    return replace(action, target=target)


def _step_result(number: int, title: str, outcomes: list[CheckOutcome]) -> StepResult:
    return StepResult(number, title, step_status(outcomes), tuple(outcomes))


def _rank(findings: list[Finding], playbook: Playbook) -> tuple[Finding, ...]:
    fired = {f.check: f for f in findings if f.severity != "info"}
    order = {c.id: i for i, c in enumerate(c for s in playbook.steps for c in s.checks)}

    def strongest(roots) -> str | None:
        # The most severe, then the largest: a queue behind slow input (critical) and a
        # small neighbour (warning) is the input's.
        return max(roots, key=lambda r: (severity_rank(fired[r].severity),
                                         round(fired[r].impact, 3)), default=None)  # fmt: skip

    def cause_of(check: str) -> str | None:
        # Of the fired roots that can explain it all, the strongest.
        c = playbook.check(check)
        return strongest(r for r in c.consequence_of if r in fired and covers(r, c))

    def covers(root: str, c) -> bool:
        # A loss that slows all work alike inflates a share of time by at most its own
        # share: 11 % of step time lost to a neighbour does not explain 60 % of TTFT in
        # input processing. A queue grows faster than the loss near saturation, so it is
        # the loss's unless the queue at the engine's load without the loss would still
        # fire — in an open loop. A closed loop's queue is structural: n clients under
        # limits that run fewer keep the rest waiting, each for about (n − c) / c
        # service times, so a loss stretching service alike leaves its share of latency
        # unchanged: the limit is the cause, whatever the load. A root with a mechanism of
        # its own (slow input stalling deliveries) is not limited.
        # A fact that models itself without the root (evidence `without_<root>`: prefill
        # interference with balanced replicas) is the root's when that falls below the
        # check's threshold; otherwise only in part.
        without = _evidence(fired[c.id], "without_" + root.replace("-", "_"))
        if without == without and c.threshold is not None:
            return not without >= c.threshold
        r = playbook.check(root)
        if not r.slows_everything or c.threshold is None:
            return True
        value, loss = _number(fired[c.id].value), _number(fired[root].value)
        if c.time_share:
            return not value - loss >= c.threshold
        if c.queue_share:
            if _closed_loop(fired[c.id]):
                return False
            # A fact that knows its queue's ρ (the slots' load where the sequence cap
            # held it) is judged by it, else by the engine's busy share; one that is a
            # part of the queue (the bursts') scales with the whole queue's share.
            busy = _evidence(fired[c.id], "slot_load")
            busy = busy if busy == busy else _evidence(fired[root], "engine_busy_pct")
            queue = _evidence(fired[c.id], "queue_pct")
            part = value / queue if queue == queue and queue >= value > 0 else 1.0
            return not queue_share_without_loss(value / part, loss, busy) * part >= c.threshold
        return True

    def root_of(check: str) -> str | None:
        # The fired check it follows from (cause_of), followed to the end of the chain (the
        # playbook has no cycles): a queue that follows saturation that follows a
        # preemption storm is the storm's.
        root = cause_of(check)
        while root is not None:
            up = cause_of(root)
            if up is None:
                return root
            root = up
        return None

    resolved = [
        _replace(f, consequence_of=root_of(f.check) if f.severity != "info" else None)
        for f in findings
    ]

    # A root ranks as severe as the worst finding it explains: a collective wait behind
    # a critical communication share is the critical problem to fix.
    worst = {f.check: f.severity for f in resolved if f.severity != "info"}
    for f in resolved:
        if f.consequence_of is not None:
            worst[f.consequence_of] = max(worst[f.consequence_of], f.severity, key=severity_rank)

    def in_part(f: Finding) -> str | None:
        # A root that a fired root explains in part (a neighbour took some of its time)
        # follows that root among findings as severe: fixing the root shrinks it.
        if f.severity == "info" or f.consequence_of:
            return None
        c = playbook.check(f.check)
        # A closed loop's queue is no part a neighbour took (see covers).
        alike = c.queue_share and _closed_loop(f)
        roots = [r for r in c.consequence_of if r in fired]
        return strongest(r for r in roots if not (alike and playbook.check(r).slows_everything))

    resolved = [_replace(f, in_part_from=in_part(f)) for f in resolved]

    def key(f: Finding):
        if f.severity == "info":
            group = 3
        elif f.step <= QUALIFYING_STEP:
            group = 0
        else:
            group = 2 if f.consequence_of else 1
        severity = worst.get(f.check, f.severity) if group == 1 else f.severity
        partly = f.in_part_from is not None
        return (group, -severity_rank(severity), partly, -round(f.impact, 3), f.step,
                order[f.check])  # fmt: skip

    ranked = sorted(resolved, key=key)
    return tuple(_replace(f, rank=i + 1) for i, f in enumerate(ranked))


def queue_share_without_loss(share: float, loss: float, busy: float) -> float:
    """The share of latency a queue would take if a loss slowing all work alike (a share
    `loss` of step time) were gone, at the engine's load (`busy`: the share of time it
    ran steps). Kingman's approximation: the wait scales as ρ / (1 − ρ) × service time;
    without the loss the service time shrinks by (1 − loss) and ρ with it, while the
    rest of the latency shrinks by (1 − loss). Saturated either way (ρ ≥ 1) or unknown
    load: the queue is the loss's (returns 0)."""
    if not (0 < busy < 1 and 0 <= loss < 1 and 0 <= share <= 1):
        return 0.0
    quiet = busy * (1 - loss)
    scale = (quiet / (1 - quiet)) / (busy / (1 - busy)) * (1 - loss)
    queue, rest = share * scale, (1 - share) * (1 - loss)
    return queue / (queue + rest) if queue + rest > 0 else 0.0


def _closed_loop(f: Finding) -> bool:
    """The finding's run drove a closed loop (its `loop` evidence, where it has one)."""
    return any(e.name == "loop" and e.value == "closed loop" for e in f.evidence)


def _evidence(f: Finding, name: str) -> float:
    return next((_number(e.value) for e in f.evidence if e.name == name), float("nan"))


def _number(value) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _replace(f: Finding, **changes) -> Finding:
    from dataclasses import replace

    return replace(f, **changes)


def _scenario(s: Scenario, ctx: TriageContext, ranked: tuple[Finding, ...]) -> ScenarioResult:
    result = evaluate_fact(s.symptom_fact, ctx, dict(s.symptom_params))
    route = set(s.route)
    explained = tuple(f.check for f in ranked if f.check in route and f.severity != "info")
    if isinstance(result, Unavailable):
        return ScenarioResult(s.id, s.title, "unknown", None, explained, result.reason)
    present = s.symptom.severity(result.value) is not None
    return ScenarioResult(
        s.id, s.title, "present" if present else "absent", _plain(result.value), explained
    )
