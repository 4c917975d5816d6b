"""Facts about the host and the probes: was the machine shared (step 4), did steps run
slower than their batch explains (step 4), did a probe hold the engine (the gate)?
Arithmetic in analyzers/host.py and analyzers/step_cost.py."""

from __future__ import annotations

from ..analyzers.actions import other_action
from ..analyzers.findings import IdList
from ..analyzers.host import REASONS
from ..analyzers.impact import uniform_impact
from .facts import (
    Fact,
    TriageContext,
    Unavailable,
    ev,
    fact,
    finite,
    impact_evidence,
    itl_impact,
    ms,
    share,
    token_price,
    ttft_impact,
)

UNEXPLAINED_WARNING = 0.25  # share of step time beyond the model with no recorded reason

_REASON_ADVICE = {
    "probe": "Measure latency on a run without the profiler window (keep --profile-steps "
    "for op detail).",
    "JIT compile": "Warm the engine up over the batch shapes it will meet before measuring "
    "(perfdiag run --warmup): each new specialisation of a Triton kernel compiles once, "
    "while the GPU idles.",
    "gc": "Keep garbage collection out of the step loop (gc.freeze() after start-up, a "
    "larger gen-0 threshold) or allocate fewer Python objects per step.",
    "preemption": "Give the KV pool room so running requests are not evicted (see the "
    "preemption findings).",
    "host contention": "Run the engine on cores no other process uses (taskset, cgroups, "
    "a quiet machine).",
    "CPU wait": "In these steps the process got far less CPU than its steps usually do, "
    "without being preempted: its threads waited for cores (other processes, or the "
    "hypervisor's steal; keep the CPU sampler on, the default, to see them) or on the disk. "
    "Re-run on a quiet machine or on cores no other process uses (taskset, cgroups).",
    "new shape": "Warm the engine up over the batch shapes it will meet before measuring "
    "(perfdiag run --warmup).",
    "unexplained": "Profile the slowest steps (perfdiag run --profile-steps A:B around them).",
}


@fact(
    "host_contention",
    provides=(
        "cores",
        "others_cores",
        "busy_pct",
        "process_cores",
        "cpu_ratio",
        "reference_ratio",
        "switches_per_s",
        "starved_pct",
        "lost_s",
        "steal_pct",
        "run_queue_pct",
        "engine_busy_pct",
        "mean_gain",
        "tail_gain",
    ),
)
def host_contention(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the engine's step time lost because the process was starved of CPU by
    other processes (each core it keeps busy preempted hundreds of times a second while
    others held a share of the machine, or the machine saturated by others): what every
    latency metric is inflated by."""
    h = ctx.get("host")
    if h is None:
        return ctx.missing("host")
    impact = uniform_impact(h.lost_share)
    evidence = (
        ev("cores", "logical cores", h.cores),
        ev("others_cores", "cores used by other processes", h.others_cores),
        ev("busy_pct", "machine busy", h.machine_busy_share, "%"),
        ev("process_cores", "cores used by the engine's process", h.process_cores),
        ev("cpu_ratio", "CPU per second of step (median)", h.step_cpu_ratio),
        ev("reference_ratio", "the same in steps not starved", h.reference_ratio),
        ev("switches_per_s", "involuntary context switches per second of step", h.switches_per_s),
        ev("starved_pct", "step time in starved steps", h.starved_share, "%"),
        ev("lost_s", "step time lost to other processes", h.lost_s, "s"),
        ev("steal_pct", "CPU stolen by the hypervisor", h.steal_share, "%"),
        ev("run_queue_pct", "step time spent waiting for a CPU", h.run_queue_share, "%"),
        # How loaded the engine was: what a queue's size depends on (see evaluate.covers).
        ev("engine_busy_pct", "engine busy (step time over the run)", h.engine_busy_share, "%"),
        *impact_evidence(impact, "latency"),
    )
    per = h.per_step
    worst_steps = per[per["starved"].to_numpy(bool)].nlargest(5, "lost_s")
    lost = tuple(str(i) for i in worst_steps["step_id"])
    ids = (IdList("step", "most time lost to other processes", lost),)
    value = h.lost_share
    action = other_action(
        "environment", "ttft.p50", "Re-run on a quiet machine, or on cores no other process uses."
    )
    return Fact(value, evidence, ids, impact=value, max_severity=impact.max_severity, action=action)


@fact(
    "step_inflation",
    provides=(
        "steps",
        "inflated_ms",
        "busy_pct",
        "reasons",
        "top_reason",
        "advice",
        "sigma_ms",
        "mean_gain",
        "tail_gain",
        "slo_gain",
        "fixed_ms",
        "per_token_us",
        "per_seq_ms",
    ),
)
def step_inflation(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the engine's step time that the step cost model cannot explain: steps
    slower than their batch by more than the noise (the model's inflated steps), less
    what probes caused (the gate accounts for those)."""
    inf, cost = ctx.get("inflation"), ctx.get("step_cost")
    if inf is None or cost is None:
        return ctx.missing("inflation")
    engine = {r: s for r, s in inf.by_reason_s.items() if r != "probe"}
    total = sum(engine.values())
    value = share(total, cost.busy_s) if cost.busy_s else 0.0
    top = max(engine, key=engine.get) if total > 0 else "unexplained"
    reasons = ", ".join(f"{r} {ms(s):.0f} ms" for r, s in engine.items() if s > 0) or "none"
    impacts = []
    itl, ttft = ctx.get("itl"), ctx.get("ttft")
    if itl is not None and len(itl.per_gap):
        impacts.append(itl_impact(ctx, itl.per_gap, "inflation_s"))
    if ttft is not None and len(ttft.per_request):
        impacts.append(ttft_impact(ctx, ttft.per_request, "inflation_s"))
    impact = max(impacts, key=lambda i: i.strength, default=uniform_impact(value))
    evidence = (
        ev("steps", "inflated steps", int((inf.per_step["reason"] != "probe").sum())),
        ev("inflated_ms", "time beyond the model", ms(total), "ms"),
        ev("busy_pct", "of step time", value, "%"),
        ev("reasons", "what the run recorded then", reasons),
        ev("top_reason", "most of it", top),
        ev("advice", "advice", _REASON_ADVICE[top]),
        ev("sigma_ms", "model noise (robust σ)", ms(cost.residual_sigma_s), "ms"),
        ev("fixed_ms", "fixed cost per step", ms(cost.fixed_s), "ms"),
        token_price(cost),
        ev("per_seq_ms", "per decoding sequence", ms(cost.per_decode_seq_s), "ms"),
        *impact_evidence(impact, "latency"),
    )
    per = inf.per_step[(inf.per_step["reason"] != "probe").to_numpy()]
    worst_steps = tuple(str(i) for i in per["step_id"].head(5))
    ids = (IdList("step", "most time beyond the model", worst_steps),)
    value = value if finite(value) else 0.0
    severity = impact.max_severity
    if top in ("unexplained", "CPU wait"):
        # Nothing the run recorded coincides with it, or only a lack of CPU whose cause the
        # run cannot tell: a note (with the steps to profile), not a cause, unless the model
        # misses a large share of the engine's time — and never critical.
        severity = "info" if value < UNEXPLAINED_WARNING else "warning"
    return Fact(value, evidence, ids, impact=value, max_severity=severity)


@fact(
    "probe_stalls",
    provides=(
        "stalls",
        "total_ms",
        "largest_ms",
        "names",
        "requests",
        "window",
        "window_inflated_ms",
    ),
)
def probe_stalls(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the run's engine time (first step to last) in which a probe held the
    engine between steps — the profiler starting or stopping — plus the profiled steps'
    own slowdown; requests that waited through it are named."""
    p = ctx.get("probe_stalls")
    steps = ctx.run.steps
    if p is None or not len(steps):
        return Unavailable("the run has no steps table")
    span = float(steps["end_ns"].max() - steps["start_ns"].min())
    inf = ctx.get("inflation")
    in_window = inf.by_reason_s.get("probe", 0.0) if inf is not None else 0.0
    value = share(p.total_s * 1e9 + in_window * 1e9, span)
    touched = _touched(ctx)
    evidence = (
        ev("stalls", "probe stalls", p.count),
        ev("total_ms", "engine held", ms(p.total_s), "ms"),
        ev("largest_ms", "largest", ms(p.largest_s), "ms"),
        ev("names", "which", ", ".join(p.names) or "none"),
        ev("requests", "requests that waited through one", len(touched)),
        ev(
            "window",
            "profiled steps",
            f"{p.window_steps[0]}–{p.window_steps[1]}" if p.window_steps else "none",
        ),
        ev("window_inflated_ms", "profiled steps' slowdown", ms(in_window), "ms"),
    )
    ids = (IdList("request", "waited through a probe stall", tuple(touched[:5])),)
    value = value if finite(value) else 0.0
    return Fact(value, evidence, ids, impact=value)


def _touched(ctx: TriageContext) -> list[str]:
    out: dict[str, float] = {}
    t, itl = ctx.get("ttft"), ctx.get("itl")
    if t is not None and len(t.per_request):
        pr = t.per_request[t.per_request["probe_s"].to_numpy() > 0]
        out.update(zip(pr["request_id"].astype(str), pr["probe_s"], strict=True))
    if itl is not None and len(itl.per_gap):
        g = itl.per_gap[itl.per_gap["probe_s"].to_numpy() > 0]
        for rid, v in g.groupby("request_id", observed=True)["probe_s"].sum().items():
            out[str(rid)] = out.get(str(rid), 0.0) + float(v)
    return [k for k, _ in sorted(out.items(), key=lambda kv: -kv[1])]


assert set(_REASON_ADVICE) == set(REASONS)
