"""Facts about how the scheduler sliced the work (step 3): prompts cut into more steps
than they need. Priced by the run's step cost model (analyzers/step_cost.py)."""

from __future__ import annotations

import numpy as np

from ..analyzers.findings import IdList
from .facts import (
    Fact,
    TriageContext,
    Unavailable,
    ev,
    fact,
    impact_evidence,
    ms,
    share,
    ttft_impact,
)

OVERHEAD_TARGET = 0.2  # a chunk whose fixed step cost is at most a fifth of its cost


@fact(
    "chunk_overhead",
    provides=("chunk", "steps_per_prefill", "overhead_ms", "ttft_ms", "fixed_ms",
              "per_token_us", "advice", "mean_gain", "tail_gain", "slo_gain"),
)  # fmt: skip
def chunk_overhead(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the mean TTFT that prompts pay in fixed step costs beyond their first
    prefill step: a prompt cut into n chunks pays a step's fixed cost n times, and all
    but one of those could be saved by larger chunks."""
    t, cost = ctx.get("ttft"), ctx.get("step_cost")
    if t is None:
        return ctx.missing("ttft")
    if cost is None or cost.per_prefill_token_s <= 0 or cost.fixed_s <= 0:
        return Unavailable("the step cost model cannot price a prefill token for this run")
    pr = t.per_request
    e = ctx.run.request_events
    chunks = e[(e["kind"] == "prefill_chunk").to_numpy() & (e["side"] == "engine").to_numpy()]
    n = chunks.groupby("request_id", observed=True).size()
    steps = n.reindex(pr["request_id"].astype(str)).fillna(1).to_numpy(np.float64)
    steps = np.maximum(steps, 1.0)
    avoidable = pr["step_overhead_s"].to_numpy() * (steps - 1) / steps
    frame = pr.assign(avoidable_overhead_s=avoidable)
    value = share(float(avoidable.mean()), t.mean.ttft_s) if len(pr) else 0.0
    impact = ttft_impact(ctx, frame, "avoidable_overhead_s")
    chunk = ctx.chunk_size
    evidence = (
        ev("chunk", "prefill chunk", f"{chunk} tokens" if chunk else "whole prompts"),
        ev("steps_per_prefill", "steps per prompt (mean)", float(steps.mean())),
        ev("overhead_ms", "fixed cost beyond the first step, per request", ms(avoidable.mean()),
           "ms"),
        ev("ttft_ms", "mean TTFT", ms(t.mean.ttft_s), "ms"),
        ev("fixed_ms", "fixed cost per step", ms(cost.fixed_s), "ms"),
        ev("per_token_us", "per prefill token", cost.per_prefill_token_s * 1e6, "µs"),
        ev("advice", "advice", _slice_advice(ctx, cost, chunk, ctx.get("composition"))),
        *impact_evidence(impact, "TTFT"),
    )  # fmt: skip
    most = frame.assign(n=steps).nlargest(5, "n")["request_id"].astype(str)
    ids = (IdList("request", "most steps per prompt", tuple(most)),)
    value = value if np.isfinite(value) else 0.0
    return Fact(value, evidence, ids, impact=value, max_severity=impact.max_severity)


def _slice_advice(ctx, cost, chunk, comp) -> str:
    """What cuts prompts into many steps — the chunk size or the token budget (whichever
    is smaller) — and the value at which a step's fixed cost is at most OVERHEAD_TARGET
    of a slice's cost, bounded by the longest prompt; what it saves and what a slice
    then costs decodes. Empty when no larger slice is possible."""
    a, f = cost.per_prefill_token_s, cost.fixed_s
    prompts = ctx.run.requests["prompt_tokens"].to_numpy("float64", na_value=np.nan)
    if not np.isfinite(prompts).any():
        return ""
    longest, mean_prompt = int(np.nanmax(prompts)), float(np.nanmean(prompts))
    budget = ctx.engine_setting("max_batched_tokens", "scheduler", "max_num_batched_tokens")
    decodes = int(np.ceil(comp.mean_decode_seqs)) if comp is not None else 0
    # Decodes are scheduled first: the budget leaves this much for prefill.
    room = budget - decodes if budget else None
    limits = {k: v for k, v in (("chunk", chunk), ("budget", room)) if v}
    if not limits:
        return ""
    knob = min(limits, key=limits.get)
    now = limits[knob]
    want = int(np.ceil(f * (1 - OVERHEAD_TARGET) / OVERHEAD_TARGET / a / 16) * 16)
    best = min(want, -(-longest // 16) * 16)
    if best <= now:
        return ""
    saved = (np.ceil(mean_prompt / now) - np.ceil(mean_prompt / best)) * f
    steps = f"{np.ceil(mean_prompt / best):.0f} steps instead of {np.ceil(mean_prompt / now):.0f}"
    if knob == "chunk":
        head = f"Set --chunk-size {best} (now {chunk})"
        if room and room < best:
            head += f" and --max-batched-tokens {best + decodes} (now {budget})"
    else:
        head = (
            f"Set --max-batched-tokens {best + decodes} (now {budget}: with about {decodes} "
            f"decodes per step it left {room} tokens for prefill)"
        )
        if chunk and chunk < best:
            head += f" and --chunk-size {best} (now {chunk})"
    return (
        f"{head}: a prompt of the mean length ({mean_prompt:.0f} tokens) then takes {steps}, "
        f"about {ms(saved):.0f} ms less TTFT; a slice then holds a decode back "
        f"{ms(best * a):.0f} ms instead of {ms(now * a):.0f} ms."
    )
