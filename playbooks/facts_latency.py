"""Facts of step 3: TTFT, ITL and queue time, decomposed (analyzers/ttft.py, itl.py)."""

from __future__ import annotations

import numpy as np

from ..analyzers.actions import Action, Setting, other_action, run_action
from ..analyzers.itl import CAUSES
from ..analyzers.run_config import section
from ..analyzers.ttft import PARTS
from .advice import (
    NO_ADVICE,
    OVERHEAD_TARGET,
    kv_advice,
    seq_cap_advice,
    token_budget_advice,
)
from .balanced_interference import balanced_evidence
from .facts import (
    Fact,
    Param,
    TriageContext,
    Unavailable,
    arrival_spec,
    ev,
    fact,
    impact_evidence,
    itl_impact,
    ms,
    share,
    stall_predicted,
    ttft_impact,
    ttft_predicted,
    worst,
)
from .spec_interference import spec_evidence

# What prefill interference costs users: the stall in each request's stream (its longest
# gap), at the 90th percentile over requests — spikes rarer than 1 % of gaps reach most
# streams yet leave ITL p99 unmoved. The playbook's `verify:` names the same metric.
STALL_TARGET = "stall.p90"
TTFT_TARGET = "ttft.p50"  # ttft-prefill-interference's advice is judged on the median
_PART_LABEL = {
    "input_s": "input processing",
    "queue_s": "engine queue",
    "cache_load_s": "cache load (swap-in)",
    "prefill_own_s": "own prefill",
    "step_overhead_s": "fixed cost of its prefill steps",
    "prefill_others_s": "others' prefill and decode",
    "inflation_s": "step inflation",
    "probe_s": "probe stalls",
    "host_gap_s": "host gaps between steps",
    "sample_return_s": "sampling and return",
    "remainder_s": "unexplained",
}
# Parts whose fix is a code change, not a setting: shown, never applied by a re-run.
_CODE_ACTIONS = {
    "input_s": other_action(
        "code", "ttft.p50", "Profile and speed up tokenisation and validation, off the event loop."
    ),
}
_LIMIT_LABEL = {
    "max_num_seqs": "the sequence cap",
    "token_budget": "the token budget",
    "kv_blocks": "free KV blocks",
    "preemption": "a preemption in the step",
    "swapped": "swapped requests first",
    "none": "nothing (arrived mid-step)",
}


@fact(
    "ttft_part_share",
    provides=(
        "part",
        "part_ms",
        "part_p99_ms",
        "ttft_ms",
        "ttft_p99_ms",
        "tail_share",
        "requests",
        "step_ms",
        "mean_gain",
        "tail_gain",
        "slo_gain",
        "binding",
        "binding_pct",
        "limits",
        "kv_peak_pct",
        "chunking",
        "inherent_ms",
        "limit_advice",
        "loop",
        "clients",
        "predicted_gain",
        "predicted_interval",
    ),
    part=Param(str, choices=PARTS),
    inherent_steps=Param(float, 0.0),
)
def ttft_part_share(ctx: TriageContext, part: str, inherent_steps: float) -> Fact | Unavailable:
    """Share of the mean TTFT spent in one part of its critical path (input processing,
    engine queue, others' prefill, host gaps, sampling and return, …), less the first
    `inherent_steps` mean step durations of it in each request (a request arriving
    mid-step waits for that step to end: up to one step of queue is inherent)."""
    t = ctx.get("ttft")
    if t is None:
        return ctx.missing("ttft")
    if not t.engine_events or t.mean.requests == 0:
        return Unavailable("no request has engine events to decompose its TTFT")
    comp = ctx.get("composition")
    step_s = comp.busy_s / comp.steps if comp is not None and comp.steps else 0.0
    per_request = t.per_request
    inherent = inherent_steps * step_s
    if inherent > 0:
        avoidable = np.maximum(per_request[part].to_numpy("float64") - inherent, 0.0)
        per_request = per_request.assign(**{part: avoidable})
    mean_part = float(per_request[part].mean()) if inherent > 0 else getattr(t.mean, part)
    tail_part = getattr(t.p99, part)
    value = share(mean_part, t.mean.ttft_s)
    evidence = (
        ev("part", "part", _PART_LABEL[part]),
        ev("part_ms", f"mean {_PART_LABEL[part]}", ms(mean_part), "ms"),
        ev("part_p99_ms", f"{_PART_LABEL[part]} in the p99 tail", ms(tail_part), "ms"),
        ev("ttft_ms", "mean TTFT", ms(t.mean.ttft_s), "ms"),
        ev("ttft_p99_ms", "TTFT of the p99 tail", ms(t.p99.ttft_s), "ms"),
        ev("tail_share", "share in the p99 tail", share(tail_part, t.p99.ttft_s), "%"),
        ev("requests", "requests decomposed", t.mean.requests),
        ev("step_ms", "mean step", ms(step_s), "ms"),
        ev("chunking", "chunked prefill", _chunking(ctx)),
    )
    evidence += (ev("inherent_ms", "inherent wait left out, per request", ms(inherent), "ms"),)
    impact = ttft_impact(ctx, per_request, part)
    action = _CODE_ACTIONS.get(part)
    if part == "queue_s":
        limits, (advice, action) = _limits_evidence(ctx)
        evidence += (*limits, ev("limit_advice", "advice", advice), *_loop_evidence(ctx))
        saved = _queue_saved(ctx, per_request, action)
        if saved is not None:
            frame = per_request.assign(saved_s=saved)
            impact = ttft_predicted(ctx, frame, "saved_s", action.target)
    elif part == "prefill_others_s":
        advice, chunk_action, slice_s = _interference_advice(ctx)
        evidence += advice + spec_evidence(ctx, per_request)
        saved, action = _others_saved(ctx, per_request, chunk_action, slice_s)
        if saved is not None:
            frame = per_request.assign(saved_s=saved)
            impact = ttft_predicted(ctx, frame, "saved_s", TTFT_TARGET)
    evidence += impact_evidence(impact, "TTFT")
    ids = (worst(t.per_request, part, f"most {_PART_LABEL[part]}"),)
    impact_share = value if np.isfinite(value) else 0.0
    return Fact(
        value, evidence, ids, impact=impact_share, max_severity=impact.max_severity, action=action
    )


def _others_saved(ctx: TriageContext, per_request, chunk_action: Action | None, slice_s):
    """Per request, the TTFT the advised chunk (_interference_advice) is predicted to save
    of others' work in its prefill steps, and the action (judged on TTFT_TARGET); (None,
    None) when the step cost model cannot price it (the removal bound stands).

    After the advice a request's prompt takes ceil(tokens / chunk) steps, each still
    carrying the others' decodes and at most one advised slice of their prefill; the
    steps it adds cost the request a step and chunk each (the price of slicing), so
    the prediction is negative when slicing costs more than the interference it cuts."""
    if slice_s is None:
        return None, None
    others = per_request["prefill_others_s"].to_numpy("float64")
    if not np.isfinite(slice_s) or chunk_action is None:
        return np.zeros(len(others)), None  # no finer chunk helps: nothing a setting saves
    cost, comp = ctx.get("step_cost"), ctx.get("composition")
    chunk = float(chunk_action.settings[0].to)
    decodes = max(comp.mean_decode_seqs, 1.0)
    decode_s = float(cost.predict_s(0.0, decodes) - cost.predict_s(0.0, 0.0))
    steps_now = per_request["prefill_steps"].to_numpy("float64")
    steps_then = np.maximum(np.ceil(per_request["prefill_tokens"].to_numpy("float64") / chunk),
                            steps_now)  # fmt: skip
    left = steps_then * (slice_s + decode_s)
    added = (steps_then - steps_now) * cost.slice_cost_s
    saved = np.maximum(others - left, 0.0) - added
    action = run_action(TTFT_TARGET, *chunk_action.settings, expect=chunk_action.expect)
    return saved, action


def _limits_evidence(ctx: TriageContext) -> tuple[tuple, tuple[str, Action | None]]:
    """Which scheduler limit held waiting requests back, with how often (step 3's queue),
    and the advice for the one that held most."""
    lim = ctx.get("limits")
    if lim is None or not lim.steps_with_queue:
        return (
            ev("binding", "limit that held the queue", "no step ended with a queue"),
            ev("binding_pct", "of steps with a queue", 0.0, "%"),
            ev("limits", "limits", "no step ended with a queue"),
            ev("kv_peak_pct", "peak KV use", lim.kv_peak_share if lim else None, "%"),
        ), NO_ADVICE
    shares = sorted(((v, k) for k, v in lim.shares.items() if v > 0), reverse=True)
    limits = ", ".join(f"{_LIMIT_LABEL[k]} {v:.0%}" for v, k in shares)
    values = {"max_num_seqs": lim.max_num_seqs, "token_budget": lim.token_budget}
    binding = lim.binding
    named = _LIMIT_LABEL[binding]
    if values.get(binding):
        named += f" ({values[binding]})"
    advice = {
        "max_num_seqs": lambda: seq_cap_advice(ctx, lim),
        "token_budget": lambda: token_budget_advice(ctx, lim),
        "kv_blocks": lambda: kv_advice(ctx),
    }.get(binding, lambda: NO_ADVICE)()
    return (
        ev("binding", "limit that held the queue", named),
        ev("binding_pct", "of steps with a queue", lim.shares[binding], "%"),
        ev("limits", f"limits in the {lim.steps_with_queue} steps with a queue", limits),
        ev("kv_peak_pct", "peak KV use", lim.kv_peak_share, "%"),
    ), advice


def _loop_evidence(ctx: TriageContext) -> tuple:
    """How the load arrived: a closed loop's queue is structural (its clients against the
    limits), an open loop's grows with load and bursts (playbooks/evaluate.py)."""
    arrival = arrival_spec(ctx)
    mode = arrival.get("mode") if arrival.get("mode") in ("open", "closed") else "unknown"
    clients = arrival.get("concurrency") if mode == "closed" else None
    return (
        ev("loop", "arrivals", f"{mode} loop" if mode != "unknown" else "not recorded"),
        ev("clients", "closed-loop clients", clients if clients else "not a closed loop"),
    )


def _queue_saved(ctx: TriageContext, per_request, action: Action | None):
    """Per request, the queue wait the advised limit is predicted to save, less what the
    larger batches it admits add to the rest of its TTFT (step cost model); None when the
    advice is no limit the model prices.

    A closed loop of n clients under a cap c keeps n − c waiting, each for about
    (n − c) / c request service times; with the cap at t, (n − t) / t of the new service
    time. An open loop keeps the share of its queue that demand above t still makes:
    1 − (t − c) / (demand − c). A KV pool planned for the demand leaves no queue."""
    if action is None or not action.settings:
        return None
    lim = ctx.get("limits")
    setting = action.settings[0]
    queue = per_request["queue_s"].to_numpy("float64")
    rest = per_request["ttft_s"].to_numpy("float64") - queue
    if setting.option in ("engine.kv_blocks", "engine.kv_cache_mb"):
        return queue
    now, to = setting.now, setting.to
    if not (isinstance(now, int | float) and isinstance(to, int | float) and to > now > 0):
        return None
    if setting.option == "engine.max_seqs":
        arrival = arrival_spec(ctx)
        clients = arrival.get("concurrency") if arrival.get("mode") == "closed" else None
        if clients and clients > now:
            left = (max(clients - to, 0) / to) / ((clients - now) / now)
        elif lim is not None and lim.demand_p90 and lim.demand_p90 > now:
            left = max(0.0, 1.0 - (to - now) / (lim.demand_p90 - now))
        else:
            return None
        slower = _step_ratio(ctx, decode_seqs=(now, to))
    elif setting.option == "engine.max_batched_tokens":
        # The advice sizes the budget to admit the waiting prompts; steps with more
        # prefill tokens cost more (the model's price of the extra tokens).
        left = 0.0
        slower = _step_ratio(ctx, prefill_tokens=(now, to))
    else:
        return None
    return queue * (1.0 - left * slower) - rest * (slower - 1.0)


def _step_ratio(ctx: TriageContext, **change) -> float:
    """How much longer a full step gets when one of its batch's terms goes from `now` to
    `to` (1 when the cost model is not trusted)."""
    cost = ctx.get("step_cost")
    if cost is None or not cost.trusted:
        return 1.0
    ((name, (now, to)),) = change.items()
    before, after = cost.predict_s(**{name: now}), cost.predict_s(**{name: to})
    return float(after / before) if before > 0 and after >= before else 1.0


@fact("ttft_overhead", provides=("ttft_ms", "own_ms"))
def ttft_overhead(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the mean TTFT that is not the request's own prefill compute: the first
    token waited for something else (a symptom, not a cause)."""
    t = ctx.get("ttft")
    if t is None or not t.engine_events:
        return ctx.missing("ttft") if t is None else Unavailable("no engine events")
    value = 1.0 - share(t.mean.prefill_own_s, t.mean.ttft_s)
    evidence = (
        ev("ttft_ms", "mean TTFT", ms(t.mean.ttft_s), "ms"),
        ev("own_ms", "own prefill", ms(t.mean.prefill_own_s), "ms"),
    )
    return Fact(value, evidence, impact=value)


def _spike(ctx: TriageContext, min_ratio: float, min_excess_ms: float):
    """(attribution, p50 gap, whether the p99 tail is a spike worth explaining)."""
    itl, m = ctx.get("itl"), ctx.get("metrics")
    if itl is None or m is None:
        return None
    p50 = m.itl_per_chunk_s.p50
    tail = itl.tail.gap_s
    spiky = bool(
        np.isfinite(p50)
        and p50 > 0
        and tail >= min_ratio * p50
        and (tail - p50) * 1e3 >= min_excess_ms
    )
    return itl, p50, spiky


@fact(
    "itl_spike",
    provides=("p50_ms", "p99_ms", "tail_ms", "ratio"),
    min_ratio=Param(float, 3.0),
    min_excess_ms=Param(float, 20.0),
)
def itl_spike(ctx: TriageContext, min_ratio: float, min_excess_ms: float) -> Fact | Unavailable:
    """The mean of the worst 1 % of gaps between deliveries over the median gap, when the
    tail is at least `min_ratio` times and `min_excess_ms` above the median (else 0)."""
    got = _spike(ctx, min_ratio, min_excess_ms)
    if got is None:
        return ctx.missing("itl")
    itl, p50, spiky = got
    ratio = itl.tail.gap_s / p50 if p50 and p50 > 0 else float("nan")
    m = ctx.get("metrics")
    evidence = (
        ev("p50_ms", "ITL p50", ms(p50), "ms"),
        ev("p99_ms", "ITL p99", ms(m.itl_per_chunk_s.p99), "ms"),
        ev("tail_ms", "mean of gaps ≥ p99", ms(itl.tail.gap_s), "ms"),
        ev("ratio", "tail / median", ratio),
    )
    return Fact(ratio if spiky else 0.0, evidence)


@fact(
    "itl_tail_share",
    provides=(
        "cause",
        "p50_ms",
        "p99_ms",
        "tail_ms",
        "cause_ms",
        "gaps",
        "dominated",
        "chunking",
        "mean_gain",
        "tail_gain",
        "slo_gain",
        "chunk_advice",
        "predicted_gain",
        "predicted_interval",
        "balanced_factor",
        "without_dp_imbalance",
    ),
    cause=Param(str, choices=CAUSES),
    min_ratio=Param(float, 3.0),
    min_excess_ms=Param(float, 20.0),
)
def itl_tail_share(
    ctx: TriageContext, cause: str, min_ratio: float, min_excess_ms: float
) -> Fact | Unavailable:
    """Share of the ITL spikes (the worst 1 % of gaps, when they stand `min_ratio` times
    and `min_excess_ms` above the median gap) explained by one cause: others' prefill
    (interference), preemption, host gaps, or delivery to the client (stream out)."""
    got = _spike(ctx, min_ratio, min_excess_ms)
    if got is None:
        return ctx.missing("itl")
    itl, p50, spiky = got
    cause_s = getattr(itl.tail, f"{cause}_s")
    value = share(cause_s, itl.tail.gap_s) if spiky else 0.0
    m = ctx.get("metrics")
    evidence = (
        ev("cause", "cause", cause.replace("_", " ")),
        ev("p50_ms", "ITL p50", ms(p50), "ms"),
        ev("p99_ms", "ITL p99", ms(m.itl_per_chunk_s.p99), "ms"),
        ev("tail_ms", "mean of gaps ≥ p99", ms(itl.tail.gap_s), "ms"),
        ev("cause_ms", f"of which {cause.replace('_', ' ')}", ms(cause_s), "ms"),
        ev("gaps", "gaps", itl.mean.gaps),
        ev(
            "dominated",
            f"tail gaps dominated by {cause.replace('_', ' ')}",
            getattr(itl.dominant_in_tail, cause),
        ),
        ev("chunking", "chunked prefill", _chunking(ctx)),
    )
    impact = itl_impact(ctx, itl.per_gap, f"{cause}_s")
    action = None
    if cause == "interference":
        advice, action, slice_s = _interference_advice(ctx)
        evidence += advice + balanced_evidence(ctx, itl.per_gap, p50, min_ratio, min_excess_ms)
        if slice_s is not None:
            # What the advice achieves, not the interference's removal: a gap then still
            # holds one slice of at most the advised size (0 saved when no finer chunk
            # would help).
            part = itl.per_gap["interference_s"].to_numpy("float64")
            saved = np.maximum(np.nan_to_num(part) - slice_s, 0.0)
            impact = stall_predicted(itl.per_gap.assign(saved_s=saved), "saved_s", STALL_TARGET)
    evidence += impact_evidence(impact, "ITL")
    ids = [worst(itl.per_gap, f"{cause}_s", f"largest {cause.replace('_', ' ')} in a gap")]
    comp = ctx.get("composition")
    if cause == "interference" and comp is not None:
        with_prefill = comp.per_step[comp.per_step["num_prefill_tokens"] > 0]
        ids.append(worst(with_prefill, "dur_s", "longest steps with prefill", "step", 5, "step_id"))
    return Fact(
        value if np.isfinite(value) else 0.0,
        evidence,
        tuple(ids),
        impact=value if np.isfinite(value) else 0.0,
        max_severity=impact.max_severity,
        action=action,
    )


def _interference_advice(ctx: TriageContext) -> tuple[tuple, Action | None, float | None]:
    """Concrete knobs for prefill interference, priced by the step cost model: the
    finest chunk whose overhead is at most OVERHEAD_TARGET of its tokens' cost (finer
    chunks cost more TTFT than they save ITL), what a decode's worst gap then
    becomes, and what the longest prompt pays for it. Never suggests what is in effect
    already or a change in the wrong direction. Also returns what a prompt's slice costs
    a step once the advice is applied (inf when no finer chunk is advised: nothing is
    saved; None when the model cannot price it)."""
    chunk = ctx.chunk_size
    budget = ctx.engine_setting("max_batched_tokens", "scheduler", "max_num_batched_tokens")
    cost, comp = ctx.get("step_cost"), ctx.get("composition")
    prompts = ctx.run.requests["prompt_tokens"].to_numpy("float64", na_value=np.nan)
    longest = int(np.nanmax(prompts)) if np.isfinite(prompts).any() else None
    generic = (
        f"Chunk long prompts more finely so decodes interleave with them (chunked prefill "
        f"now: {_chunking(ctx)})."
    )
    if cost is None or comp is None or not cost.trusted or cost.per_prefill_token_s <= 0:
        return (ev("chunk_advice", "chunking", generic),), None, None
    decodes = max(comp.mean_decode_seqs, 1.0)
    decode_step = cost.predict_s(0.0, decodes)
    sizes = [x for x in (chunk, budget, longest) if x]
    effective = min(sizes) if sizes else None
    # The finest chunk whose step and chunk overhead is at most OVERHEAD_TARGET of its
    # tokens' cost: finer slicing costs more TTFT and load than it takes off a decode's
    # wait (and chunk-too-small would then name it).
    best = cost.finest_slice(OVERHEAD_TARGET) or 1 << 16  # priced by the chosen model
    if effective is None or best >= effective:
        text = (
            f"Chunks are already at most {effective} tokens (chunk {_chunking(ctx)}, longest "
            f"prompt {longest}): a finer chunk would not shorten a decode's wait by much. What "
            "remains is the prompts' own cost: serve shared prefixes from the cache, shorten "
            "prompts, or send long prompts to a replica of their own."
        )
        # No finer chunk is advised: the advice saves nothing a setting can.
        return (ev("chunk_advice", "chunking", text),), None, float("inf")
    now_ms = ms(cost.predict_s(effective, decodes, 0.0, 1.0))
    then_ms = ms(cost.predict_s(best, decodes, 0.0, 1.0))
    knob = f"now {chunk}" if chunk else "chunked prefill is off now"
    text = f"Set --chunk-size {best} ({knob}): a chunk then costs about "
    text += f"{ms(cost.token_cost_s(best, with_chunk=True)):.0f} ms "
    text += f"beside a {ms(decode_step):.0f} ms decode step, so a decode's worst gap should "
    text += f"fall from about {now_ms:.0f} to {then_ms:.0f} ms"
    if longest:
        extra = -(-longest // best) - -(-longest // effective)
        text += (
            f"; the longest prompt ({longest} tokens) then takes {extra} more steps, about "
            f"{ms(extra * cost.slice_cost_s):.0f} ms more TTFT"
        )
    cap = best + int(np.ceil(decodes))
    settings = [Setting("engine.chunk_size", chunk, best)]
    pf = comp.per_step[comp.per_step["num_prefill_tokens"] > 0]
    shared = float((pf["num_prefill_seqs"] > 1).mean()) if len(pf) else 0.0
    if budget and cap < budget and shared >= 0.1:
        # Several prompts' chunks fill one step: the chunk bounds a prompt's slice, only
        # the token budget bounds the step's, so both go together.
        text += (
            f"; with --max-batched-tokens {cap} (now {budget}), since {shared:.0%} of "
            "prefill steps held several prompts' chunks and only the budget bounds a step"
        )
        settings.append(Setting("engine.max_batched_tokens", budget, cap))
    expect = f"worst gap about {then_ms:.0f} ms instead of {now_ms:.0f} ms"
    action = run_action(STALL_TARGET, *settings, expect=expect)
    advice = (ev("chunk_advice", "chunking", text + "."),)
    return advice, action, float(cost.token_cost_s(best, decodes, with_chunk=True))


def _chunking(ctx: TriageContext) -> str:
    size = ctx.chunk_size
    if size is not None:
        return f"{size} tokens per step"
    recorded = "chunk_size" in section(ctx.run_options, "engine") or (
        "enable_chunked_prefill" in section(ctx.config, "engine_config", "scheduler")
    )
    return "off" if recorded else "unknown"
