"""Concrete advice for the scheduler and memory knobs: which knob, its value now, a value
to try and the effect the run's own numbers predict — as words and as an `Action` a
re-run can apply (analyzers/actions.py).

Each helper returns (text, action); ("", None) when the run gives no ground for a change
(the knob is not what binds, or the value it would propose is already in effect). The
values come from the run: queue depths and KV use per step, request lengths, and the
step cost model's prices — never from a constant tuned to a scenario.
"""

from __future__ import annotations

import math

import numpy as np

from ..analyzers.actions import Action, Setting, run_action
from ..analyzers.scheduler import pool_blocks
from .facts import TriageContext, ms

KV_TARGET = 0.9  # plan the KV pool to be at most this full at the demand it must hold
# A prompt slice whose step and chunk overhead is at most this share of its tokens' cost:
# what chunk-too-small asks for, and the finest chunk interference advice may propose
# (finer, and the slicing costs more TTFT and load than it saves ITL).
OVERHEAD_TARGET = 0.2
NO_ADVICE: tuple[str, Action | None] = ("", None)


def seq_cap_advice(ctx: TriageContext, lim, target: str = "ttft.p50") -> tuple[str, Action | None]:
    """The sequence cap held the queue: raise max_num_seqs to the demand, as far as the
    KV pool allows at the use it showed per sequence; a step then holds that many more
    decodes, priced by the cost model. `target`: the TTFT percentile the queue moved
    (bursts queue only the requests that arrive in them: the tail)."""
    cap, demand = lim.max_num_seqs, lim.demand_p90
    if not cap or not demand:
        return NO_ADVICE
    per_seq = lim.kv_share_when_queued / cap if np.isfinite(lim.kv_share_when_queued) else 0.0
    allowed = int(KV_TARGET / per_seq) if per_seq > 0 else demand
    to = min(demand, allowed)
    if to <= cap:
        if allowed <= cap:
            return (
                f"The KV pool would not hold more sequences ({lim.kv_share_when_queued:.0%} in "
                f"use at {cap}): give it more memory (--kv-cache-mb) before raising "
                f"--max-seqs.",
                None,
            )
        return NO_ADVICE
    text = (
        f"Set --max-seqs {to} (now {cap}): {demand} requests wanted to run at once (p90 of "
        f"running + waiting in steps with a queue), and the KV pool was "
        f"{lim.kv_share_when_queued:.0%} used at {cap}, so it holds about {allowed}"
    )
    cost = ctx.get("step_cost")
    if cost is not None and cost.per_decode_seq_s > 0:
        text += (
            f"; a full decode step then costs up to {ms((to - cap) * cost.per_decode_seq_s):.1f}"
            " ms more: the price in ITL of taking the queue in"
        )
        seen = int(np.nanmax(ctx.run.steps["num_decode_seqs"].to_numpy("float64")))
        if to > seen:  # a price per sequence measured on smaller batches: an upper bound
            text += f" (priced from batches of at most {seen}; larger ones amortise it)"
    expect = f"most of the queue wait gone; ITL up by about {(to - cap)} decodes' cost"
    return text + ".", run_action(target, Setting("engine.max_seqs", cap, to), expect=expect)


def token_budget_advice(ctx: TriageContext, lim) -> tuple[str, Action | None]:
    """The token budget held the queue: raise it so a step can admit the waiting
    requests' prompts (bounded at four times the budget: one change at a time)."""
    budget = lim.token_budget
    if not budget or not lim.steps_with_queue or lim.demand_p90 is None:
        return NO_ADVICE
    prompts = ctx.run.requests["prompt_tokens"].to_numpy("float64", na_value=np.nan)
    if not np.isfinite(prompts).any():
        return NO_ADVICE
    waiting = lim.waiting_p90
    want = budget + waiting * float(np.nanmean(prompts))
    to = int(math.ceil(min(4 * budget, want) / 256) * 256)
    if to <= budget:
        return NO_ADVICE
    text = (
        f"Set --max-batched-tokens {to} (now {budget}): in steps with a queue about "
        f"{waiting:.0f} requests of {np.nanmean(prompts):.0f} prompt tokens waited for room"
    )
    cost = ctx.get("step_cost")
    if cost is not None and cost.per_prefill_token_s > 0:
        text += (
            f"; a full step then costs up to {ms((to - budget) * cost.per_prefill_token_s):.0f}"
            " ms more, which decodes in it wait for"
        )
    setting = Setting("engine.max_batched_tokens", budget, to)
    return text + ".", run_action("ttft.p50", setting, expect="less queue wait")


def kv_advice(ctx: TriageContext) -> tuple[str, Action | None]:
    """A pool that preempts or blocks admission: the blocks the demand needs — as many
    requests as wanted to run (capped by max_num_seqs) at the 90th percentile of a
    request's full length (prompt + output) — planned to be at most KV_TARGET full."""
    pool = pool_blocks(ctx.run.steps)
    r = ctx.run.requests
    block = ctx.engine_setting("block_size", "cache", "block_size") or 16
    lengths = (r["prompt_tokens"] + r["output_tokens"]).to_numpy("float64", na_value=np.nan)
    if not pool or not np.isfinite(lengths).any():
        return NO_ADVICE
    s = ctx.run.steps.drop_duplicates("step_id")
    total = s["num_running"].fillna(0) + s["num_waiting"].fillna(0) + s["num_swapped"].fillna(0)
    cap = ctx.engine_setting("max_seqs", "scheduler", "max_num_seqs")
    wanted = float(np.percentile(total.to_numpy("float64"), 90))
    seqs = min(wanted, cap) if cap else wanted
    per_request = math.ceil(float(np.nanpercentile(lengths, 90)) / block)
    need = math.ceil(seqs * per_request / KV_TARGET)
    if need <= pool:
        return NO_ADVICE
    blocks = ctx.engine_setting("kv_blocks", "cache", "num_gpu_blocks")
    capped = ", capped by --max-seqs" if cap and wanted > cap else ""
    why = (
        f"{seqs:.0f} requests at once (p90 of running + waiting{capped}) of up to "
        f"{per_request} blocks each (p90 prompt + output, {block}-token blocks)"
    )
    if blocks or not ctx.run_options:
        setting = Setting("engine.kv_blocks", blocks or pool, need)
        text = f"Set --kv-blocks {need} (now {blocks or pool}): {why}, "
        text += f"at most {KV_TARGET:.0%} full."
    else:
        mb = ctx.engine_setting("kv_cache_mb", "cache", "kv_cache_mb")
        to_mb = float(math.ceil(mb * need / pool)) if mb else None
        if to_mb is None:
            return NO_ADVICE
        setting = Setting("engine.kv_cache_mb", mb, to_mb)
        text = (
            f"Set --kv-cache-mb {to_mb:g} (now {mb:g}, {pool} blocks): {need} blocks hold {why}, "
            f"at most {KV_TARGET:.0%} full."
        )
    # Preempted requests wait to come back: what a storm costs users is completion time.
    return text, run_action("e2e.p50", setting, expect="no preemption; no request recomputed")
