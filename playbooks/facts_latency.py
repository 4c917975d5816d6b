"""Facts of step 3: TTFT, ITL and queue time, decomposed (analyzers/ttft.py, itl.py)."""

from __future__ import annotations

import numpy as np

from ..analyzers.itl import CAUSES
from ..analyzers.ttft import PARTS
from .facts import Fact, Param, TriageContext, Unavailable, ev, fact, ms, share, worst

_PART_LABEL = {
    "input_s": "input processing",
    "queue_s": "engine queue",
    "cache_load_s": "cache load (swap-in)",
    "prefill_own_s": "own prefill",
    "prefill_others_s": "others' prefill and decode",
    "host_gap_s": "host gaps between steps",
    "sample_return_s": "sampling and return",
    "remainder_s": "unexplained",
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
    ),
    part=Param(str, choices=PARTS),
    min_steps=Param(float, 0.0),
)
def ttft_part_share(ctx: TriageContext, part: str, min_steps: float) -> Fact | Unavailable:
    """Share of the mean TTFT spent in one part of its critical path (input processing,
    engine queue, others' prefill, host gaps, sampling and return, …); 0 when the part
    lasts less than `min_steps` mean step durations (a request arriving mid-step waits
    for that step to end: up to one step of queue is inherent, not a problem)."""
    t = ctx.get("ttft")
    if t is None:
        return ctx.missing("ttft")
    if not t.engine_events or t.mean.requests == 0:
        return Unavailable("no request has engine events to decompose its TTFT")
    mean_part, tail_part = getattr(t.mean, part), getattr(t.p99, part)
    comp = ctx.get("composition")
    step_s = comp.busy_s / comp.steps if comp is not None and comp.steps else 0.0
    value = share(mean_part, t.mean.ttft_s) if mean_part >= min_steps * step_s else 0.0
    evidence = (
        ev("part", "part", _PART_LABEL[part]),
        ev("part_ms", f"mean {_PART_LABEL[part]}", ms(mean_part), "ms"),
        ev("part_p99_ms", f"{_PART_LABEL[part]} in the p99 tail", ms(tail_part), "ms"),
        ev("ttft_ms", "mean TTFT", ms(t.mean.ttft_s), "ms"),
        ev("ttft_p99_ms", "TTFT of the p99 tail", ms(t.p99.ttft_s), "ms"),
        ev("tail_share", "share in the p99 tail", share(tail_part, t.p99.ttft_s), "%"),
        ev("requests", "requests decomposed", t.mean.requests),
        ev("step_ms", "mean step", ms(step_s), "ms"),
    )
    ids = (worst(t.per_request, part, f"most {_PART_LABEL[part]}"),)
    return Fact(value, evidence, ids, impact=value if np.isfinite(value) else 0.0)


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
    provides=("cause", "p50_ms", "p99_ms", "tail_ms", "cause_ms", "gaps", "dominated", "chunking"),
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
    )


def _chunking(ctx: TriageContext) -> str:
    engine = ctx.run_options.get("engine") or {}
    if "chunk_size" in engine:
        size = engine["chunk_size"]
        return "off" if size is None else f"{size} tokens per step"
    sched = (ctx.config.get("engine_config") or {}).get("scheduler") or {}
    if "enable_chunked_prefill" in sched:
        return (
            f"{sched['chunk_size']} tokens per step" if sched["enable_chunked_prefill"] else "off"
        )
    return "unknown"
