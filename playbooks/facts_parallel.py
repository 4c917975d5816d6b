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
    provides=("ranks", "comm_ms", "step_ms", "per_step", "bytes_per_step", "all_reduce_us",
              "transfer_us", "compute_ms"),
)  # fmt: skip
def comm_share(ctx: TriageContext) -> Fact | Unavailable:
    """Share of rank 0's step time spent inside collectives (all-reduces of tensor
    parallelism): time the split of the model's work has to earn back."""
    s = _summary(ctx)
    if s is None:
        return Unavailable(_NONE)
    evidence = (
        ev("ranks", "ranks", s.ranks),
        ev("comm_ms", "in collectives per step", s.comm_ms_per_step, "ms"),
        ev("step_ms", "step time", s.step_ms, "ms"),
        ev("per_step", "collectives per step", s.collectives_per_step),
        ev("bytes_per_step", "bytes per step per rank", s.bytes_per_step, "B"),
        ev("all_reduce_us", "collective (median)", s.all_reduce_us, "µs"),
        ev("transfer_us", "of which transfer (median)", s.all_reduce_transfer_us, "µs"),
        ev("compute_ms", "step time outside collectives", s.step_ms - s.comm_ms_per_step, "ms"),
    )
    return Fact(s.comm_share, evidence, impact=s.comm_share)


@fact(
    "collective_wait",
    provides=("ranks", "straggler", "late_share", "lateness_us", "wait_ms", "uncertainty_us"),
)
def collective_wait(ctx: TriageContext) -> Fact | Unavailable:
    """Share of all ranks' collective time spent waiting for the last rank to enter: the
    straggler is the rank that enters last most often, and by how much."""
    s = _summary(ctx)
    if s is None:
        return Unavailable(_NONE)
    if s.ranks < 2:
        return Unavailable("the run's collectives come from one rank")
    evidence = (
        ev("ranks", "ranks", s.ranks),
        ev("straggler", "rank entering last most often", s.straggler_rank),
        ev("late_share", "of collectives it entered last", s.straggler_share, "%"),
        ev("lateness_us", "how late (median)", s.straggler_lateness_us, "µs"),
        ev("wait_ms", "waiting, per rank",
           ", ".join(f"{r}: {w:.0f} ms" for r, w in s.rank_wait_ms.items())),
        ev("uncertainty_us", "clock alignment uncertainty", s.clock_uncertainty_us, "µs"),
    )  # fmt: skip
    return Fact(s.wait_share, evidence, impact=s.wait_share)


def _tp(run) -> int:
    par = (run.manifest.config or {}).get("parallel") or {}
    return int(par.get("tensor_parallel_size") or 1)


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
