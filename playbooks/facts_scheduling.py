"""Facts about how the scheduler sliced the work (step 3): prompts cut into more steps
than they need. Priced by the run's step cost model (analyzers/step_cost.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..analyzers.actions import Action, Setting, run_action
from ..analyzers.findings import IdList
from ..analyzers.ttft import prefill_steps_s
from .advice import NO_ADVICE, OVERHEAD_TARGET
from .facts import (
    Fact,
    TriageContext,
    Unavailable,
    ev,
    fact,
    impact_evidence,
    ms,
    share,
    slot_factor,
    token_price,
    ttft_impact,
)

UNPRICED_STEP = 8  # how far to enlarge a slice whose tokens the model cannot price


@fact(
    "chunk_overhead",
    provides=("chunk", "steps_per_prefill", "overhead_ms", "gap_ms", "without_host_bound",
              "slot_factor", "queue_ms", "ttft_ms", "fixed_ms", "chunk_ms", "per_token_us",
              "advice", "mean_gain", "tail_gain", "slo_gain"),
)  # fmt: skip
def chunk_overhead(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the mean TTFT that prompts pay in fixed step costs and host gaps beyond
    their first prefill step: a prompt cut into n chunks pays a step's fixed cost n times
    and waits the gap between steps n − 1 times, and all but one step of those could be
    saved by larger chunks."""
    t, cost = ctx.get("ttft"), ctx.get("step_cost")
    if t is None:
        return ctx.missing("ttft")
    if cost is None or cost.slice_cost_s <= 0:
        return Unavailable("the step cost model prices no step or chunk overhead for this run")
    pr = t.per_request
    e = ctx.run.request_events
    chunks = e[(e["kind"] == "prefill_chunk").to_numpy() & (e["side"] == "engine").to_numpy()]
    request_ids = pr["request_id"].astype(str)
    n = chunks.groupby("request_id", observed=True).size()
    steps = np.maximum(n.reindex(request_ids).fillna(1).to_numpy(np.float64), 1.0)
    # Beyond the first step: its fixed cost in every further step, every further chunk's,
    # and the context every further chunk reads again.
    extra = pr["extra_chunks_s"].to_numpy()
    reread = _reread_context(chunks, ctx.run.requests).reindex(request_ids).fillna(0).to_numpy()
    avoidable = (pr["step_overhead_s"].to_numpy() - extra) * (steps - 1) / steps + extra
    avoidable = avoidable + cost.per_context_token_s * reread
    # The model prices steps as they run uninflated, while TTFT holds the inflation of
    # its steps (a neighbour's theft, stalls): the extra steps are inflated alike, so the
    # overhead is scaled by its own prefill steps' inflation (else a neighbour taking a
    # third of each step would shrink the chunk's share of TTFT by a third).
    avoidable = avoidable * _inflation_factor(pr)
    # Between its steps the prompt also waits the host's gap (scheduling, a host-bound
    # loop's stall): one step has no gap inside its window, so every gap is the slicing's.
    gaps = np.where(steps > 1, pr["host_gap_s"].to_numpy("float64"), 0.0)
    own_s = float(avoidable.mean()) if len(pr) else 0.0
    avoidable = avoidable + gaps
    overhead_s = float(avoidable.mean()) if len(pr) else 0.0
    # In a closed loop held at its limit, a slot freed sooner also shortens the queue.
    factor = slot_factor(ctx)
    avoidable = avoidable * factor
    frame = pr.assign(avoidable_overhead_s=avoidable)
    value = min(share(float(avoidable.mean()), t.mean.ttft_s), 1.0) if len(pr) else 0.0
    # The slicing's own share were the host gaps gone (host-bound fixed): the check is
    # host-bound's consequence when that falls below its threshold (playbooks/evaluate).
    gap_s = float(gaps.mean()) if len(pr) else 0.0
    without_gaps = share(own_s * factor, t.mean.ttft_s - gap_s * factor) if len(pr) else 0.0
    queue_ms = ms(overhead_s * (factor - 1.0)) if factor > 1.0 else None
    impact = ttft_impact(ctx, frame, "avoidable_overhead_s")
    chunk = ctx.chunk_size
    gap_per_step = share(float(gaps.sum()), float(np.maximum(steps - 1, 0).sum()))
    advice, action = _slice_advice(ctx, cost, chunk, ctx.get("composition"), gap_per_step)
    evidence = (
        ev("chunk", "prefill chunk", f"{chunk} tokens" if chunk else "whole prompts"),
        ev("steps_per_prefill", "steps per prompt (mean)", float(steps.mean())),
        ev("overhead_ms", "fixed cost and host gaps beyond the first step, per request",
           ms(overhead_s), "ms"),
        ev("gap_ms", "of which host gaps between its steps", ms(gap_s), "ms"),
        ev("without_host_bound", "share were the host gaps gone", min(without_gaps, 1.0)),
        ev("slot_factor", "TTFT per second of slot time (a closed loop's queue grows with it)",
           factor),
        ev("queue_ms", "queue it adds, per request (closed loop)", queue_ms, "ms"),
        ev("ttft_ms", "mean TTFT", ms(t.mean.ttft_s), "ms"),
        ev("fixed_ms", "fixed cost per step", ms(cost.fixed_s), "ms"),
        ev("chunk_ms", "cost per chunk beyond its tokens", ms(cost.per_prefill_chunk_s), "ms"),
        token_price(cost),
        ev("advice", "advice", advice),
        *impact_evidence(impact, "TTFT"),
    )  # fmt: skip
    most = frame.assign(n=steps).nlargest(5, "n")["request_id"].astype(str)
    ids = (IdList("request", "most steps per prompt", tuple(most)),)
    value = value if np.isfinite(value) else 0.0
    return Fact(value, evidence, ids, impact=value, max_severity=impact.max_severity, action=action)


def _inflation_factor(per_request) -> np.ndarray:
    """Per request, its prefill steps' time over that time less their inflation (the
    residual beyond the step cost model; analyzers/ttft.py): 1 where nothing inflated."""
    window = prefill_steps_s(per_request)
    inflated = window + per_request["inflation_s"].to_numpy("float64")
    return np.divide(inflated, window, out=np.ones(len(window)), where=window > 0)


def _reread_context(chunks, requests) -> pd.Series:
    """Per request, the context tokens its chunks read beyond what one chunk would: a
    chunk attends to every token before its end, so a prompt cut into chunks ending at
    e1 < e2 < … < en reads e1 + … + en where one chunk reads en. The step cost model's
    context price (when it keeps one) makes that a cost of the slicing."""
    if chunks.empty:
        return pd.Series(dtype=np.float64)
    cached = requests.set_index(requests["request_id"].astype(str))["cached_tokens"]
    c = chunks.assign(request_id=chunks["request_id"].astype(str)).sort_values("ts_ns")
    start = cached.reindex(c["request_id"]).fillna(0).to_numpy(np.float64)
    ends = c.groupby("request_id")["num_tokens"].cumsum().to_numpy(np.float64) + start
    per = pd.DataFrame({"request_id": c["request_id"].to_numpy(), "end": ends})
    g = per.groupby("request_id")["end"]
    return g.sum() - g.max()


def _steps_phrase(mean_prompt: float, longest: int, best: int, now: int) -> str:
    """How many steps a prompt takes at the new slice against now: the mean prompt's when
    they differ, else the longest's (a mean prompt that fits one slice either way would
    read "takes 1 step instead of 1")."""
    tokens, which = mean_prompt, f"a prompt of the mean length ({mean_prompt:.0f} tokens)"
    if np.ceil(mean_prompt / best) == np.ceil(mean_prompt / now):
        tokens, which = longest, f"the longest prompt ({longest} tokens)"
    after, before = int(np.ceil(tokens / best)), int(np.ceil(tokens / now))
    return f"{which} then takes {after} step{'s' * (after != 1)} instead of {before}"


def _slice_advice(ctx, cost, chunk, comp, gap_s: float) -> tuple[str, Action | None]:
    """What cuts prompts into many steps — the chunk size or the token budget (whichever
    is smaller) — and the value at which a step's fixed cost is at most OVERHEAD_TARGET
    of a slice's cost, bounded by the longest prompt; what it saves (the model's step
    costs and the run's host gap of `gap_s` per step) and what a slice then costs
    decodes. ("", None) when no larger slice is possible."""
    a = cost.per_prefill_token_s
    prompts = ctx.run.requests["prompt_tokens"].to_numpy("float64", na_value=np.nan)
    if not np.isfinite(prompts).any():
        return NO_ADVICE
    longest, mean_prompt = int(np.nanmax(prompts)), float(np.nanmean(prompts))
    budget = ctx.engine_setting("max_batched_tokens", "scheduler", "max_num_batched_tokens")
    decodes = int(np.ceil(comp.mean_decode_seqs)) if comp is not None else 0
    # Decodes are scheduled first: the budget leaves this much for prefill.
    room = budget - decodes if budget else None
    limits = {k: v for k, v in (("chunk", chunk), ("budget", room)) if v}
    if not limits:
        return NO_ADVICE
    knob = min(limits, key=limits.get)
    now = limits[knob]
    whole = -(-longest // 16) * 16
    # Overhead at most OVERHEAD_TARGET of a slice's cost = at most T / (1 − T) of its
    # tokens', priced by the chosen model (roofline: below the ridge a slice pays the
    # weights' read again, so the answer lies past it).
    want = cost.finest_slice(OVERHEAD_TARGET / (1 - OVERHEAD_TARGET), limit=max(whole, 16))
    if want is None and a > 0:  # no slice up to the longest prompt pays off: one step
        want = whole
    elif want is None:  # the run cannot price a token apart from its chunk (all chunks
        want = UNPRICED_STEP * now  # alike): one bounded step at a time, checked by re-running
    best = min(want, whole)
    if best <= now:
        return NO_ADVICE
    lengths = prompts[np.isfinite(prompts)]
    # Per request, then averaged: prompts just above a slice pay a whole extra step.
    saved = float(np.mean(cost.prefill_time_s(lengths, now) - cost.prefill_time_s(lengths, best)))
    if np.isfinite(gap_s):
        saved += gap_s * float(np.mean(np.ceil(lengths / now) - np.ceil(lengths / best)))
    steps = _steps_phrase(mean_prompt, longest, best, now)
    chunk_to = Setting("engine.chunk_size", chunk, best)
    budget_to = Setting("engine.max_batched_tokens", budget, best + decodes)
    if knob == "chunk":
        head = f"Set --chunk-size {best} (now {chunk})"
        settings = [chunk_to]
        if room and room < best:
            head += f" and --max-batched-tokens {best + decodes} (now {budget})"
            settings.append(budget_to)
    else:
        head = (
            f"Set --max-batched-tokens {best + decodes} (now {budget}: with about {decodes} "
            f"decodes per step it left {room} tokens for prefill)"
        )
        settings = [budget_to]
        if chunk and chunk < best:
            head += f" and --chunk-size {best} (now {chunk})"
            settings.append(chunk_to)
    text = f"{head}: {steps}, about {ms(saved):.1f} ms less mean TTFT; "
    if a > 0:
        text += (
            f"a slice then holds a decode back {ms(cost.token_cost_s(best, with_chunk=True)):.0f}"
            f" ms instead of {ms(cost.token_cost_s(now, with_chunk=True)):.0f} ms (priced by "
            f"{cost.priced_by})."
        )
    else:
        text += (
            "the run's chunks are all alike, so what a larger one costs decodes is not "
            "known: check ITL p99 on the re-run."
        )
    expect = f"about {ms(saved):.1f} ms less mean TTFT"
    return text, run_action("ttft.p50", *settings, expect=expect)


@fact(
    "cold_starvation",
    provides=("policy", "max_wait", "cold_requests", "hot_requests", "cold_wait_ms",
              "hot_wait_ms", "cold_p99_wait_ms", "hot_p99_wait_ms", "cold_ttft_ms", "groups",
              "advice", "mean_gain", "tail_gain", "slo_gain"),
)  # fmt: skip
def cold_starvation(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the cold-prefix requests' mean TTFT that is queue wait beyond what the
    hot-prefix requests of the same run waited: the disadvantage a cache-aware admission
    order gives requests whose prefix is not cached (the hot class is the baseline).
    Means, not medians, so one hot group cannot hide a starved tail."""
    f = ctx.get("fairness")
    if f is None:
        return ctx.missing("fairness")
    fr = f.per_request
    cls = fr["hotness"].to_numpy() if fr is not None else np.array([])
    hot, cold = cls == "hot", cls == "cold"
    if not hot.any() or not cold.any():
        return Unavailable("the run has no hot and cold prefix classes (no shared prefixes)")
    wait = fr["queue_wait_s"].to_numpy("float64")
    hot_wait = float(np.mean(wait[hot]))
    excess = np.where(cold, np.maximum(wait - hot_wait, 0.0), 0.0)
    cold_ttft = float(np.mean(fr["ttft_s"].to_numpy("float64")[cold]))
    value = share(float(excess[cold].mean()), cold_ttft)
    value = value if np.isfinite(value) else 0.0
    impact = ttft_impact(ctx, fr.assign(excess_s=excess), "excess_s")
    policy = ctx.engine_setting("policy", "scheduler", "policy")
    max_wait = ctx.engine_setting("max_wait_ms", "scheduler", "max_wait_ms")
    by_group = fr[cold].groupby("prefix_group", observed=True)["queue_wait_s"].mean().nlargest(3)
    groups = ", ".join(f"group {g}: {ms(w):.0f} ms" for g, w in by_group.items())
    advice, action = _fairness_advice(fr, hot, cold, policy, max_wait) if value else NO_ADVICE
    evidence = (
        ev("policy", "admission policy", policy or "unknown"),
        ev("max_wait", "fairness bound", f"{max_wait:g} ms" if max_wait else "off"),
        ev("cold_requests", "cold-prefix requests", int(cold.sum())),
        ev("hot_requests", "hot-prefix requests", int(hot.sum())),
        ev("cold_wait_ms", "mean queue wait, cold", ms(wait[cold].mean()), "ms"),
        ev("hot_wait_ms", "mean queue wait, hot", ms(hot_wait), "ms"),
        ev("cold_p99_wait_ms", "p99 queue wait, cold", ms(np.percentile(wait[cold], 99)), "ms"),
        ev("hot_p99_wait_ms", "p99 queue wait, hot", ms(np.percentile(wait[hot], 99)), "ms"),
        ev("cold_ttft_ms", "mean TTFT, cold", ms(cold_ttft), "ms"),
        ev("groups", "cold groups that waited longest (mean)", groups),
        ev("advice", "advice", advice),
        *impact_evidence(impact, "TTFT"),
    )
    longest = fr[cold].nlargest(5, "queue_wait_s")["request_id"].astype(str)
    ids = (IdList("request", "cold requests that waited longest", tuple(longest)),)
    return Fact(value, evidence, ids, impact=value, max_severity=impact.max_severity, action=action)


def _fairness_advice(fr, hot, cold, policy, max_wait) -> tuple[str, Action | None]:
    """Bound a cold request's wait by what hot requests take in all: --max-wait-ms at the
    hot class's p99 TTFT (a request waiting longer goes first), or FCFS when the bound is
    already that tight; nothing under FCFS (the order is not what starves them)."""
    if policy != "prefix":
        return NO_ADVICE
    ttft = fr["ttft_s"].to_numpy("float64")
    bound = float(np.ceil(np.percentile(ttft[hot], 99) * 10) / 10 * 1e3)  # ms, to 100 ms
    cold_p99 = ms(np.percentile(fr["queue_wait_s"].to_numpy("float64")[cold], 99))
    if max_wait is None or bound < max_wait:
        now = f"{max_wait:g}" if max_wait else "off"
        text = (
            f"Set --max-wait-ms {bound:g} (now {now}): a request waiting longer than the hot "
            f"requests' p99 TTFT then goes first, so a cold request's p99 wait "
            f"({cold_p99:.0f} ms) should fall to about {bound:g} ms, while hot prefixes keep "
            "their priority below it."
        )
        setting = Setting("engine.max_wait_ms", max_wait, bound)
        return text, run_action("ttft.p99", setting, expect=f"cold p99 wait about {bound:g} ms")
    text = (
        f"Set --policy fcfs (now prefix): the fairness bound ({max_wait:g} ms) is already "
        "tighter than what hot requests take, so cache-aware order costs cold prefixes more "
        "than it saves."
    )
    setting = Setting("engine.policy", "prefix", "fcfs")
    return text, run_action("ttft.p99", setting, expect="cold and hot waits alike")
