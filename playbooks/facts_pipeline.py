"""Facts of step 4 for pipeline-parallel runs (`perfdiag run --pp N`): bubbles from too few
micro-batches, a stage slower than the others, and PP against another layout of the same
cores (analyzers/pipeline.py has the definitions and the models behind the advice)."""

from __future__ import annotations

from ..analyzers import pipeline
from ..analyzers.actions import Setting, run_action
from ..analyzers.impact import WARNING_MEAN_GAIN, Impact
from ..analyzers.run_config import section
from .facts import Fact, TriageContext, Unavailable, ev, fact

_NONE = "the run has no pipeline stages (perfdiag run --pp N records them)"


def _summary(ctx: TriageContext):
    if "pp_summary" not in ctx.memo:
        ctx.memo["pp_summary"] = pipeline.summarize(ctx.run)
    return ctx.memo["pp_summary"]


def _common(s) -> tuple:
    return (
        ev("stages", "stages", s.stages),
        ev("microbatches", "micro-batches per step (median)", s.microbatches),
        ev("asked", "micro-batches asked (--pp-microbatches)", s.microbatches_asked),
        ev("requests", "requests per step (median)", s.median_requests),
        ev("bubble", "stage-time idle (measured)", s.bubble, "%"),
        ev("expected", "fill and drain at this m: (p−1)/(m+p−1)", s.expected_bubble, "%"),
        ev("transfer", "stage-time moving activations (exposed)", s.transfer_share, "%"),
        ev("steps", "steps", s.steps),
    )


@fact("pp_bubbles", provides=("stages", "microbatches", "asked", "requests", "bubble",
                              "expected", "transfer", "steps", "advice", "m_new",
                              "expected_new", "ratio", "gain", "k", "overlap"))  # fmt: skip
def pp_bubbles(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the stages' time idle in the pipeline's fill and drain: the expected
    bubble (p−1)/(m+p−1) at the run's micro-batches per step (the measured bubble, which
    adds imbalance and transfers, is evidence). The advice: the micro-batch count with the
    shortest predicted step window (analyzers/pipeline.py's cost model: fill and drain
    against the fixed cost and the hop each micro-batch adds, overlapped stages slowed by
    the contention factor k of analyzers/pipeline_overlap.py), capped by the requests a
    step holds. Severity from the predicted gain on E2E p50 (analyzers/impact.py): info
    when it is under 10 % — or no count is predicted to pay."""
    s = _summary(ctx)
    if s is None:
        return Unavailable(_NONE)
    adv = pipeline.microbatch_advice(s)
    # the window is the forward's part of a step: the step's host work does not shrink
    forward = min(s.window_ns / s.steps_ns, 1.0) if s.steps_ns else 1.0
    better = adv.microbatches > s.microbatches and adv.forward_ratio < 0.98
    gain = (1.0 - adv.forward_ratio) * forward if better else 0.0  # only more are advised
    helps = better and gain >= WARNING_MEAN_GAIN
    overlap = s.contention.describe(s.stages)
    cost = (f"a micro-batch costs the slowest stage at least {s.mb_fixed_ns / 1e6:.2f} ms, "
            f"{s.ns_per_token / 1e3:.0f} µs per token above that, and {s.hop_ns / 1e6:.2f} ms "
            f"per hop; {s.tokens_per_step:.0f} tokens per step; {overlap}")  # fmt: skip
    priced = (f"{adv.microbatches} micro-batches (now {s.microbatches_asked}; "
              f"{s.microbatches:g} per step ran): fill and drain fall from "
              f"{s.expected_bubble:.0%} to {adv.expected_bubble:.0%} of the stages' time; "
              f"predicted forward time per step ×{adv.forward_ratio:.2f}, E2E "
              f"{-gain:+.0%} ({cost})")  # fmt: skip
    if helps:
        advice = f"Set --pp-microbatches {adv.microbatches}: {priced}."
    elif better:
        advice = (f"More micro-batches are not predicted to pay enough to advise: {priced}; "
                  f"under the {WARNING_MEAN_GAIN:.0%} of E2E an advice must be predicted to "
                  f"gain.")  # fmt: skip
    elif s.contention.blocked:
        c = s.contention
        advice = (f"More micro-batches are not predicted to pay on this host: overlapped, "
                  f"the {s.stages} stages would keep {c.need_cores:.1f} cores busy of the "
                  f"{(c.cores or 0) - c.others_cores:.1f} free, sharing them. A run at "
                  f"--pp-microbatches 2 measures how much slower overlapped stages "
                  f"compute here; to gain from overlap, give each stage cores of its own (a "
                  f"larger host, a GPU per stage) or use fewer stages (--pp "
                  f"{max(1, s.stages // 2)}).")  # fmt: skip
    elif s.microbatches >= s.median_requests:
        advice = (f"A step holds {s.median_requests:g} requests (median) and a micro-batch "
                  f"whole requests: more micro-batches need more requests in flight (a "
                  f"higher --concurrency or --max-seqs), or fewer stages (--pp "
                  f"{max(1, s.stages // 2)}).")  # fmt: skip
    else:
        advice = (f"More micro-batches are not predicted to pay here: {cost}; more "
                  f"micro-batches pay these more often than the fill and drain they save; "
                  f"fewer stages (--pp {max(1, s.stages // 2)}) or larger batches per "
                  f"step.")  # fmt: skip
    evidence = (
        *_common(s),
        ev("advice", "advice", advice),
        ev("m_new", "micro-batches advised", adv.microbatches),
        ev("expected_new", "fill and drain then", adv.expected_bubble, "%"),
        ev("ratio", "predicted forward time then / now", adv.forward_ratio, "×"),
        ev("gain", "predicted E2E saved then", gain, "%"),
        ev("k", f"overlapped stage compute / alone ({s.contention.model})", s.contention.k, "×"),
        ev("overlap", f"contention ({s.contention.model})", overlap),
    )
    action = None
    if helps:
        action = run_action("e2e.p50", Setting("engine.pp_microbatches", s.microbatches_asked,
                                               adv.microbatches),
                            expect=f"forward time per step ×{adv.forward_ratio:.2f}")  # fmt: skip
    severity = Impact(gain, gain, target="e2e.p50", target_gain=gain).max_severity
    return Fact(s.expected_bubble, evidence, impact=s.expected_bubble, action=action,
                max_severity=severity if helps else "info")  # fmt: skip


@fact("pp_stage_imbalance", provides=("stages", "microbatches", "asked", "requests", "bubble",
                                      "expected", "transfer", "steps", "slowest", "imbalance",
                                      "per_stage", "advice", "ratio"))  # fmt: skip
def pp_stage_imbalance(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the slowest stage's compute the others sit idle for it (1 − mean/max):
    every micro-batch moves at the slowest stage's pace. The advice: the boundary layers
    to move to a neighbour, from each stage's measured cost per layer."""
    s = _summary(ctx)
    if s is None:
        return Unavailable(_NONE)
    per = s.per_stage
    layers = pipeline.stage_layers(ctx.run, s.stages)
    top = float(per["compute_ns"].max())
    value = 1.0 - float(per["compute_ns"].mean()) / top if top > 0 else 0.0
    rows = "; ".join(
        f"stage {int(r.stage)}: layers {layers[int(r.stage)][0]}–{layers[int(r.stage)][1] - 1}, "
        f"{r.compute_ns / 1e6 / max(s.steps, 1):.2f} ms per step "
        f"({r.per_layer_ns / 1e6 / max(s.steps, 1):.3f} ms per layer)"
        for r in per.itertuples()
    )
    move = pipeline.layer_move(s, layers)
    advice, action = "", None
    if move is not None:
        now = ",".join(str(int(n)) for n in per["layers"])
        to = ",".join(map(str, move.new_split))
        names = ", ".join(map(str, move.layers))
        advice = (f"Move layer{'s' if len(move.layers) > 1 else ''} {names} from stage "
                  f"{move.from_stage} to stage {move.to_stage}: --pp-layers {to} (now {now}); "
                  f"predicted slowest stage ×{move.forward_ratio:.2f} "
                  f"({move.forward_ratio - 1:+.0%} per micro-batch).")  # fmt: skip
        action = run_action("e2e.p50", Setting("engine.pp_layers", now, to),
                            expect=f"slowest stage ×{move.forward_ratio:.2f}")  # fmt: skip
    evidence = (
        *_common(s),
        ev("slowest", "slowest stage", s.slowest_stage),
        ev("imbalance", "slowest stage over the mean", s.imbalance, "%"),
        ev("per_stage", "per stage", rows),
        ev("advice", "advice", advice),
        ev("ratio", "predicted slowest stage then / now",
           move.forward_ratio if move else 1.0, "×"),
    )  # fmt: skip
    return Fact(value, evidence, impact=value, action=action)


def layout(run) -> str:
    """'PP 2 (m 2)', 'TP 2', 'DP 2' or '1 process' from a run's manifest."""
    config = run.manifest.config or {}
    par, dp = section(config, "parallel"), section(config, "data_parallel")
    if int(par.get("pipeline_parallel_size") or 1) > 1:
        return f"PP {par['pipeline_parallel_size']} (m {par.get('pipeline_microbatches')})"
    if int(par.get("tensor_parallel_size") or 1) > 1:
        return f"TP {par['tensor_parallel_size']}"
    if int(dp.get("size") or 1) > 1:
        return f"DP {dp['size']}"
    return "1 process"


def _cpus(run) -> int | None:
    env = getattr(run.manifest, "environment", None) or {}
    n = env.get("cpu_count") if isinstance(env, dict) else None
    return int(n) if n else None


@fact("pp_scaling", provides=("layout_a", "layout_b", "tps_a", "tps_b", "itl_a", "itl_b",
                              "bubble", "cores"))  # fmt: skip
def pp_scaling(ctx: TriageContext) -> Fact | Unavailable:
    """Against a baseline with another layout of the same cores (TP, DP, or one process)
    where one side is pipeline-parallel: this run's output tokens/s over the baseline's,
    with ITL and this side's bubble to say why."""
    if ctx.baseline is None:
        return Unavailable("needs a baseline run with another parallel layout")
    a, b = layout(ctx.baseline.run), layout(ctx.run)
    if "PP" not in a + b or a == b:
        return Unavailable("neither run is pipeline-parallel, or both have the same layout")
    ma, mb = ctx.baseline.get("metrics"), ctx.get("metrics")
    if ma is None or mb is None:
        return Unavailable("a run has no serving metrics")
    tps_a, tps_b = ma.throughput.output_tokens_per_s, mb.throughput.output_tokens_per_s
    pp_side = ctx if "PP" in b else ctx.baseline
    s = _summary(pp_side) if pp_side is ctx else pipeline.summarize(pp_side.run)
    cores, cores_a = _cpus(ctx.run), _cpus(ctx.baseline.run)
    if cores and cores_a and cores != cores_a:
        return Unavailable(f"the runs had different cores ({cores_a} and {cores}): not the "
                           "same resources split another way")  # fmt: skip
    evidence = (
        ev("layout_a", "baseline", a),
        ev("layout_b", "this run", b),
        ev("tps_a", "baseline output tokens/s", tps_a, "tok/s"),
        ev("tps_b", "output tokens/s", tps_b, "tok/s"),
        ev("itl_a", "baseline ITL p50", ma.itl_per_token_s.p50 * 1e3, "ms"),
        ev("itl_b", "ITL p50", mb.itl_per_token_s.p50 * 1e3, "ms"),
        ev("bubble", "the PP run's stage-time idle", s.bubble if s else float("nan"), "%"),
        ev("cores", "logical cores", cores if cores else "not recorded"),
    )
    return Fact(tps_b / tps_a if tps_a else float("nan"), evidence)
