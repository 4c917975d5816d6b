"""Facts of step 4 for tensor-parallel runs: the share of step time in collectives, and how
much of it is waiting for the slowest rank (analyzers/collectives.py). They read the
collectives every rank recorded (engine_ref's --tp, or an import with seq-numbered comm
spans); runs without them are not evaluated."""

from __future__ import annotations

from ..analyzers import collectives
from .facts import Fact, TriageContext, Unavailable, ev, fact

_NONE = "the run has no per-rank collectives (a tensor-parallel run records them)"


def _summary(ctx: TriageContext):
    """Computed once per triage (both facts read it)."""
    if "comm_summary" not in ctx.memo:
        ctx.memo["comm_summary"] = collectives.summarize(ctx.run)
    return ctx.memo["comm_summary"]


@fact(
    "comm_share",
    provides=("ranks", "comm_ms", "own_ms", "wait_ms", "step_ms", "per_step", "bytes_per_step",
              "all_reduce_us", "transfer_us", "compute_ms"),
)  # fmt: skip
def comm_share(ctx: TriageContext) -> Fact | Unavailable:
    """Share of rank 0's step time inside collectives once every rank has entered them
    (all-reduces of tensor parallelism): what the collectives cost themselves, which the
    split of the model's work has to earn back. Time spent waiting for a later rank is
    the straggler's (collective_wait), not the collectives'."""
    s = _summary(ctx)
    if s is None:
        return Unavailable(_NONE)
    evidence = (
        ev("ranks", "ranks", s.ranks),
        ev("comm_ms", "in collectives per step", s.comm_ms_per_step, "ms"),
        ev("own_ms", "of which with every rank in", s.own_comm_ms_per_step, "ms"),
        ev("wait_ms", "of which waiting for a later rank",
           s.comm_ms_per_step - s.own_comm_ms_per_step, "ms"),
        ev("step_ms", "step time", s.step_ms, "ms"),
        ev("per_step", "collectives per step", s.collectives_per_step),
        ev("bytes_per_step", "bytes per step per rank", s.bytes_per_step, "B"),
        ev("all_reduce_us", "collective (median)", s.all_reduce_us, "µs"),
        ev("transfer_us", "of which transfer (median)", s.all_reduce_transfer_us, "µs"),
        ev("compute_ms", "step time outside collectives", s.step_ms - s.comm_ms_per_step, "ms"),
    )  # fmt: skip
    value = s.own_comm_ms_per_step / s.step_ms if s.step_ms > 0 else float("nan")
    return Fact(value, evidence, impact=value)


# A straggler getting less than this share of the others' CPU per second is short of CPU.
_CPU_SHORT = 0.75


@fact(
    "collective_wait",
    provides=("ranks", "straggler", "late_share", "lateness_us", "wait_ms", "imbalance_ms",
              "uncertainty_us", "bound_pct", "fwd_ms", "others_fwd_ms", "cpu_per_s",
              "others_cpu_per_s", "switches", "others_switches", "why"),
)  # fmt: skip
def collective_wait(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the step time lost to one rank arriving late at the collectives: the other
    ranks' waiting for it less its own waiting for them (waiting both ways is jitter;
    one-sided waiting is a straggler), and why it is late — its forwards against the
    others', and the CPU its process got over them."""
    s = _summary(ctx)
    if s is None:
        return Unavailable(_NONE)
    if s.ranks < 2:
        return Unavailable("the run's collectives come from one rank")
    r = s.waited_for_rank
    me = s.hosts.get(r)
    others = [h for k, h in s.hosts.items() if k != r]
    o_fwd = _mean_of(h.forward_ms for h in others)
    o_cpu = _mean_of(h.cpu_per_s for h in others)
    o_sw = _mean_of(h.switches_per_forward for h in others)
    why = _why(me, o_cpu)
    evidence = (
        ev("ranks", "ranks", s.ranks),
        ev("straggler", "the rank the others wait for", r),
        ev("imbalance_ms", "step time lost waiting for it", s.imbalance_ms_per_step, "ms"),
        ev("late_share", "of collectives it entered last",
           s.straggler_share if s.straggler_rank == r else 1 - s.straggler_share, "%"),
        ev("lateness_us", "how late the last rank came (median)", s.straggler_lateness_us, "µs"),
        ev("wait_ms", "waiting in collectives, per rank",
           ", ".join(f"{k}: {w:.0f} ms" for k, w in s.rank_wait_ms.items())),
        ev("fwd_ms", f"rank {r}'s forward (median)", me.forward_ms if me else float("nan"), "ms"),
        ev("others_fwd_ms", "the others' forward (median)", o_fwd, "ms"),
        ev("cpu_per_s", f"CPU per second of rank {r}'s forwards",
           me.cpu_per_s if me else float("nan")),
        ev("others_cpu_per_s", "the others'", o_cpu),
        ev("switches", f"preemptions per forward, rank {r}",
           me.switches_per_forward if me else float("nan")),
        ev("others_switches", "the others'", o_sw),
        ev("why", "why it is late", why),
        ev("uncertainty_us", "clock alignment uncertainty", s.clock_uncertainty_us, "µs"),
        ev("bound_pct", "what misaligned clocks could account for", s.imbalance_bound_share, "%"),
    )  # fmt: skip
    value = s.imbalance_share
    # Within what clock misalignment alone could produce, it is not a measured straggler.
    cap = "info" if not value > s.imbalance_bound_share else None
    return Fact(value, evidence, impact=value, max_severity=cap)


def _mean_of(values) -> float:
    v = [x for x in values if x == x]
    return sum(v) / len(v) if v else float("nan")


def _why(me, others_cpu: float) -> str:
    if me is None or not (me.cpu_per_s == me.cpu_per_s and others_cpu == others_cpu):
        return "the run has no host evidence per rank"
    if me.cpu_per_s < _CPU_SHORT * others_cpu:
        return (f"its process got {me.cpu_per_s:.2f} CPU-seconds per second of forward against "
                f"{others_cpu:.2f} on the others: it is short of CPU (other processes on its "
                "cores, a throttled or stopped process)")  # fmt: skip
    return (f"it got as much CPU as the others ({me.cpu_per_s:.2f} against {others_cpu:.2f} "
            "per second of forward) yet arrives late: more work on it, a slower core or "
            "device, or pauses between its forwards (stalls, work only it does)")  # fmt: skip


def _tp(run) -> int:
    par = (run.manifest.config or {}).get("parallel") or {}
    return int(par.get("tensor_parallel_size") or 1)


def _pp(run) -> int:
    par = (run.manifest.config or {}).get("parallel") or {}
    return int(par.get("pipeline_parallel_size") or 1)


def _per_token(ctx: TriageContext) -> tuple[float, float, int]:
    """(step ms per computed token, collective ms per computed token, steps) of rank 0."""
    st = ctx.run.steps
    if len(st) and st["rank"].notna().any():
        st = st[st["rank"].eq(st["rank"].min()).fillna(False).to_numpy()]
    tokens = float((st["num_prefill_tokens"] + st["num_decode_seqs"]).sum())
    step_ms = float((st["end_ns"] - st["start_ns"]).sum()) / 1e6
    s = _summary(ctx)
    comm_ms = 0.0 if s is None else s.comm_ms_per_step * s.steps
    return step_ms / tokens, comm_ms / tokens, len(st)


@fact(
    "tp_scaling",
    provides=("tp_a", "tp_b", "ms_a", "ms_b", "compute_a", "compute_b", "saved", "comm",
              "collectives", "all_reduce_us", "layers_formula"),
)  # fmt: skip
def tp_scaling(ctx: TriageContext) -> Fact | Unavailable:
    """Against a baseline at another tensor-parallel degree: the speed-up in step time per
    computed token, split into the compute the split saved and the collectives it added
    (collective latency × collectives per step × steps)."""
    if ctx.baseline is None:
        return Unavailable("needs a baseline run at another tensor-parallel degree")
    tp_a, tp_b = _tp(ctx.baseline.run), _tp(ctx.run)
    if _pp(ctx.run) > 1 or _pp(ctx.baseline.run) > 1:
        return Unavailable("a run is pipeline-parallel: pp-scaling compares the layouts")
    if tp_a == tp_b:
        return Unavailable(f"both runs have tensor parallelism {tp_a}")
    if not len(ctx.run.steps) or not len(ctx.baseline.run.steps):
        return Unavailable("a run has no engine steps")
    ms_a, comm_a, _ = _per_token(ctx.baseline)
    ms_b, comm_b, _ = _per_token(ctx)
    compute_a, compute_b = ms_a - comm_a, ms_b - comm_b
    s = _summary(ctx) if tp_b > tp_a else _summary(ctx.baseline)
    formula = "no collectives recorded"
    if s is not None:
        total_s = s.all_reduce_us * s.collectives_per_step * s.steps / 1e6
        formula = (f"{s.all_reduce_us:.0f} µs × {s.collectives_per_step:.0f} per step × "
                   f"{s.steps} steps = {total_s:.2f} s")  # fmt: skip
    evidence = (
        ev("tp_a", "baseline TP", tp_a),
        ev("tp_b", "this run TP", tp_b),
        ev("ms_a", "baseline step time per token", ms_a, "ms"),
        ev("ms_b", "step time per token", ms_b, "ms"),
        ev("compute_a", "baseline outside collectives per token", compute_a, "ms"),
        ev("compute_b", "outside collectives per token", compute_b, "ms"),
        ev("saved", "compute saved per token", compute_a - compute_b, "ms"),
        ev("comm", "collectives added per token", comm_b - comm_a, "ms"),
        ev("collectives", "collectives per step", 0 if s is None else s.collectives_per_step),
        ev("all_reduce_us", "collective latency (median)", 0 if s is None else s.all_reduce_us,
           "µs"),
        ev("layers_formula", "latency × count × steps", formula),
    )  # fmt: skip
    speedup = ms_a / ms_b if ms_b > 0 else float("nan")
    return Fact(speedup, evidence)
