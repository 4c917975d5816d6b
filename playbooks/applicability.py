"""Which parts of the triage apply to a run. A serving run (it has requests or engine
steps) gets all of them. A bare trace — a training step, or a profiler trace of unknown
purpose — has no requests, no engine and no workload, so the checks, symptoms and pins that
need them do not apply: they are listed once as "not applicable to a training trace",
never reported as data the trace lacks ("does not record: workload seed", "cannot tell:
High TTFT")."""

from __future__ import annotations

import re
from dataclasses import replace

import pyarrow.compute as pc

from ..analyzers.findings import Triage
from ..traces.reader import Run
from .triage_view import step_status

# Facts that read requests, request events, engine steps, the client's counters or what
# the engine records (expert loads, replicas, its profiler window): a bare trace has none.
# Facts that read spans, repeats or a baseline apply to any trace and stay as they are.
SERVING_FACTS = frozenset({
    "profiler_window_empty", "probe_stalls", "client_stalls", "out_of_order",
    "incomplete_lifecycles", "unexplained_latency", "measured_requests", "back_pressure",
    "wait_growth", "client_behind_schedule", "burst_queueing", "schedule_vs_target",
    "littles_law_gap", "ttft_part_share", "serial_server", "server_seq_cap",
    "server_budget_slicing", "server_ttft_parts", "cold_starvation", "chunk_overhead",
    "itl_tail_share", "host_contention", "step_inflation", "host_share", "preemption_rate",
    "server_kv_pressure", "kv_full_share", "expert_imbalance", "dp_imbalance",
    "prefix_reuse_missed", "cache_hits", "failure_rate", "slo_attainment", "output_mismatch",
    "latency_regression", "sent_below_plan", "ttft_overhead", "itl_spike",
    "spec_acceptance", "spec_no_speedup", "spec_k_gain", "kv_quant_tradeoff",
    "offload_restore_slower", "offload_thrash",
})  # fmt: skip
# The tables only a serving run fills (facts_gate.missing_tables).
SERVING_TABLES = ("requests", "request_events", "steps")
# What a reproduction of a serving run needs and a trace cannot hold (facts_gate.unpinned).
SERVING_PINS = ("engine configuration", "workload", "workload seed")
# A backward pass or an optimizer step among the host's ops: the trace is of training.
_TRAINING_OP = re.compile(
    r"^autograd::engine::evaluate_function|Backward\d*$|^Optimizer\.(?:step|zero_grad)"
    r"|^torch\.optim\."
)


def serving(run: Run) -> bool:
    """Whether the run serves requests (has requests or engine steps)."""
    tables = run.manifest.tables or {}
    return any((tables.get(t) or {}).get("rows", 0) for t in ("requests", "steps"))


def trace_kind(run: Run) -> str | None:
    """None for a serving run or one perfdiag recorded (an engine run that recorded
    nothing still lacks what it should have); "training" for a bare trace with a backward
    pass or an optimizer step; "profiler" for any other bare trace."""
    config = run.manifest.config or {}
    if serving(run) or any(k in config for k in ("run_options", "engine_config", "server")):
        return None
    names = run.arrow("spans", ["name"])["name"]
    if not len(names):
        return None  # not a trace either: nothing to judge applicability on
    unique = pc.unique(names.cast("string") if str(names.type) != "string" else names)
    if any(_TRAINING_OP.search(str(n)) for n in unique.to_pylist() if n):
        return "training"
    return "profiler"


def phrase(kind: str) -> str:
    if kind == "training":
        return "not applicable to a training trace"
    return "not applicable to a profiler trace without requests"


def apply(triage: Triage, run: Run, check_facts: dict[str, str],
          scenario_facts: dict[str, str]) -> Triage:  # fmt: skip
    """The triage with the serving-only checks taken out of their steps (a step left with
    none goes), the serving symptoms marked `not-applicable`, and both named once in
    `not_applicable` / `applicability`. A serving run's triage is returned as it is."""
    kind = trace_kind(run)
    if kind is None:
        return triage
    gone = tuple(
        c.check
        for s in triage.steps
        for c in s.checks
        if c.status == "not-evaluated" and check_facts.get(c.check) in SERVING_FACTS
    )
    steps = []
    for s in triage.steps:
        kept = tuple(c for c in s.checks if c.check not in gone)
        if kept:
            same = len(kept) == len(s.checks)
            steps.append(s if same else replace(s, checks=kept, status=step_status(kept)))
    scenarios = tuple(
        replace(s, symptom="not-applicable", reason=phrase(kind))
        if s.symptom == "unknown" and scenario_facts.get(s.scenario) in SERVING_FACTS
        else s
        for s in triage.scenarios
    )
    return replace(triage, steps=tuple(steps), scenarios=scenarios, not_applicable=gone,
                   applicability=phrase(kind))  # fmt: skip
