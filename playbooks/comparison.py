"""`compare(A, B)`: two runs side by side — the configuration and environment diff, the
metric deltas with bootstrap intervals, correctness, the findings that appeared or
disappeared, and B's triage with A as its baseline (steps 6 and 7)."""

from __future__ import annotations

from ..analyzers.compare import (
    Comparison,
    config_diff,
    correctness,
    finding_changes,
    metric_deltas,
)
from ..analyzers.trace_diff import trace_diff
from .evaluate import run_triage
from .facts import TriageContext
from .schema import Playbook, load_playbook, load_scenarios


def compare(
    a: TriageContext,
    b: TriageContext,
    playbook: Playbook | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> Comparison:
    playbook = playbook or load_playbook()
    scenarios = load_scenarios(playbook)
    deltas = metric_deltas(a.serving, b.serving, n_boot=n_boot, seed=seed)
    against = TriageContext(b.run, b.serving, baseline=a)
    against.memo["deltas"] = deltas  # the triage's step 7 reads the same intervals
    triage_b = run_triage(against, playbook, scenarios)
    triage_a = run_triage(a, playbook, scenarios)
    return Comparison(
        run_a=a.run.manifest.run_id,
        run_b=b.run.manifest.run_id,
        diff=config_diff(a.run.manifest, b.run.manifest, a.get("host"), b.get("host")),
        deltas=deltas,
        correctness=correctness(a.run, b.run),
        findings=finding_changes(triage_a, triage_b),
        triage=triage_b,
        trace=trace_diff(a.run, b.run),
    )
