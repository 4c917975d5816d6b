"""Facts of step 5 for the prefix cache's host tier (analyzers/kv_offload.py): hits by
tier with the time each saved, restores that cost more than the recompute they replace
(with the break-even prefix length), and a host tier that writes blocks it never reads
back. Runs without a host tier's counters (engine or vLLM) are not evaluated."""

from __future__ import annotations

import math

from ..analyzers import kv_offload as ko
from ..analyzers.actions import Setting, run_action
from ..analyzers.run_config import section
from .facts import Fact, TriageContext, Unavailable, ev, fact, finite, ms, share

_NONE = (
    "the run recorded no host tier for the prefix cache (no kv_offload counters from "
    "the engine, no vLLM kv_offload / external_prefix_cache counters)"
)
ENGINE_SOURCE = "engine counters (kv_hit_device/host_tokens, kv_restore_ns/bytes, kv_offload_*)"
THRASH_MIN_BLOCKS = 8  # fewer blocks written: too few to call the tier's traffic a pattern


def summary(ctx: TriageContext):
    """(OffloadSummary, evidence source, price source) or Unavailable; memoised."""
    if "offload_summary" not in ctx.memo:
        ctx.memo["offload_summary"] = _summary(ctx)
    return ctx.memo["offload_summary"]


def _summary(ctx: TriageContext):
    cost = ctx.get("step_cost")
    if ko.has_offload(ctx.run):
        price, priced = _price(cost)
        return ko.summarize(ctx.run, price), ENGINE_SOURCE, priced
    from .facts_target import server_prefill_per_token, server_record

    rec = server_record(ctx)
    if not isinstance(rec, Unavailable):
        s = ko.from_server(rec[0], server_prefill_per_token(ctx))
        if s is not None:
            names = ("external_prefix_hits", "offload_load_s", "offload_load_bytes")
            return s, rec[0].source(*names), "the server's prefill time per computed token"
    return Unavailable(_NONE)


def _price(cost) -> tuple[float, str]:
    """Seconds per prefill token and what priced it. Restores run inside the schedule
    phase, so the steps holding them are slower than their batches explain and can leave
    the fit untrusted: its own per-token price is then used, and said to be untrusted."""
    if cost is None:
        return math.nan, "no step cost model"
    if finite(cost.prefill_token_cost_s):
        return cost.prefill_token_cost_s, cost.priced_by
    per_token = getattr(cost, "per_prefill_token_s", math.nan)
    if cost.trusted and cost.chosen == "additive" and per_token == 0:
        # A trusted fit in which a prefill token adds nothing measurable to its step.
        return 0.0, f"{cost.priced_by}: a prefill token adds nothing measurable to a step"
    if finite(per_token) and per_token > 0:
        return per_token, f"{cost.priced_by}, not trusted: its per-token price taken as is"
    return math.nan, cost.priced_by


def tier_evidence(ctx: TriageContext, c) -> tuple:
    """Evidence of the cache-hits fact: tokens and time saved per tier (device, host,
    swap) and in all. Device hits at admission include the host tier's restores in the
    scheduler's record; they are split here. The host tier saves its recompute minus the
    restore copies."""
    tiers = {t.tier: t for t in c.tiers}
    price = c.cost_per_prefill_token_s
    admitted = tiers["device"].hit_tokens if "device" in tiers else 0
    swap = tiers["swap"].hit_tokens if "swap" in tiers else 0
    got = summary(ctx)
    host = host_saved = None
    if not isinstance(got, Unavailable) and got[1] == ENGINE_SOURCE:
        s = got[0]
        host, host_saved = s.host_tokens, s.net_saved_s
    device = admitted - (host or 0)
    saved = device * price + swap * price + (host_saved if host is not None else 0.0)
    busy = c.saved_s / c.saved_share - c.saved_s if finite(c.saved_share) and c.saved_share else 0
    return (
        ev("hit_pct", "prompt tokens hit at admission", c.hit_rate, "%"),
        ev("device_tokens", "device tier hits", device, "tokens"),
        ev("device_saved_ms", "device tier: prefill saved", ms(device * price), "ms"),
        ev("host_tokens", "host tier restores", host, "tokens"),
        ev("host_saved_ms", "host tier: prefill saved less the restores", ms(host_saved), "ms"),
        ev("swap_tokens", "swap tier restores", swap, "tokens"),
        ev("swap_saved_ms", "swap tier: prefill saved", ms(swap * price), "ms"),
        ev("saved_ms", "compute saved", ms(saved), "ms"),
        ev("saved_pct", "of step time", share(saved, busy + saved), "%"),
    )


def _offload_mb(ctx: TriageContext):
    return section(ctx.run_options, "engine").get("kv_offload_mb")


def _common(s: ko.OffloadSummary, source: str, priced: str) -> tuple:
    be = s.break_even_tokens
    return (
        ev("host_tokens", "prefix tokens restored from the host tier", s.host_tokens, "tokens"),
        ev("restores", "admissions that restored", s.host_admissions),
        ev(
            "median_tokens",
            "restored tokens per restoring admission (median)",
            s.median_host_tokens,
            "tokens",
        ),
        ev("restore_ms", "restore copies (host → device)", ms(s.restore_s), "ms"),
        ev("recompute_ms", "recomputing the same tokens", ms(s.recompute_s), "ms"),
        ev("restore_us_per_token", "restore per token", s.restore_token_s * 1e6, "µs"),
        ev("restore_fixed_us", "restore per copy", s.restore_fixed_s * 1e6, "µs"),
        ev("recompute_us_per_token", "prefill per token", s.recompute_token_s * 1e6, "µs"),
        ev(
            "break_even",
            "break-even prefix length",
            "never" if math.isinf(be) else (f"{be:.0f} tokens" if finite(be) else None),
        ),
        ev("restore_mb", "restored", s.restore_bytes / 2**20, "MiB"),
        ev("source", "evidence", source),
        ev("priced_by", "recompute priced by", priced),
    )


@fact(
    "offload_restore_slower",
    provides=(
        "host_tokens",
        "restores",
        "median_tokens",
        "restore_ms",
        "recompute_ms",
        "restore_us_per_token",
        "restore_fixed_us",
        "recompute_us_per_token",
        "break_even",
        "restore_mb",
        "source",
        "priced_by",
        "slower",
        "lost_ms",
        "advice",
    ),
)
def offload_restore_slower(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the host tier's restore time that recomputing the same prefix tokens would
    have saved: (restore − recompute) / restore, 0 when restoring was cheaper."""
    got = summary(ctx)
    if isinstance(got, Unavailable):
        return got
    s, source, priced = got
    if not s.host_tokens:
        return Fact(0.0, _common(s, source, priced) + _no_loss())
    if not finite(s.recompute_s):
        return Unavailable(
            f"{priced} cannot price a prefill token: restore vs recompute is not evaluated"
        )
    lost = s.restore_s - s.recompute_s
    value = max(0.0, share(lost, s.restore_s))
    mb = _offload_mb(ctx)
    advice, action = "", None
    if value > 0:
        be = s.break_even_tokens
        where = (
            "a restored token costs more than a recomputed one at any length"
            if math.isinf(be)
            else f"restoring pays only from about {be:.0f} tokens"
        )
        advice = (
            f"Turn the host tier off (--kv-offload-mb 0; vLLM: drop the offloading "
            f"connector) or keep it for prefixes past the break-even: {where}; "
            f"recomputing would have cost {ms(s.recompute_s):.1f} ms instead of "
            f"{ms(s.restore_s):.1f} ms of restores ({ms(lost):.1f} ms saved)."
        )
        if source == ENGINE_SOURCE and mb:
            action = run_action(
                "ttft.p50",
                Setting("engine.kv_offload_mb", mb, 0.0),
                expect=f"about {ms(lost):.1f} ms less prefill and restore",
            )
    evidence = (
        *_common(s, source, priced),
        ev("slower", "restores slower than their recompute", s.slower_admissions),
        ev("lost_ms", "restore time beyond recompute", ms(max(lost, 0.0)), "ms"),
        ev("advice", "advice", advice),
    )
    return Fact(value, evidence, impact=min(1.0, value), action=action)


def _no_loss() -> tuple:
    return (
        ev("slower", "restores slower than their recompute", 0),
        ev("lost_ms", "restore time beyond recompute", 0.0, "ms"),
        ev("advice", "advice", ""),
    )


@fact(
    "offload_thrash",
    provides=(
        "offloaded",
        "evicted_unused",
        "restored_blocks",
        "offload_ms",
        "wasted_ms",
        "host_mb",
        "peak_blocks",
        "source",
        "advice",
    ),
)
def offload_thrash(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the blocks written to the host tier that were evicted from it without
    ever being restored (the copies were wasted)."""
    got = summary(ctx)
    if isinstance(got, Unavailable):
        return got
    s, source, _priced = got
    if source != ENGINE_SOURCE:
        return Unavailable(
            "the server's counters do not say which offloaded blocks were "
            "evicted unused: thrash is not evaluated"
        )
    value = s.thrash_share if s.offloaded_blocks >= THRASH_MIN_BLOCKS else 0.0
    wasted = s.offload_s * s.thrash_share
    mb = _offload_mb(ctx)
    advice, action = "", None
    if value > 0 and s.host_tokens == 0:
        advice = (
            f"Nothing was ever restored: turn the host tier off (--kv-offload-mb 0) "
            f"and save the copies' {ms(s.offload_s):.1f} ms."
        )
        to = 0.0
    elif value > 0:
        to = float(2 * mb) if mb else None
        advice = (
            f"The hot prefixes do not fit: raise --kv-offload-mb"
            f"{f' from {mb:g} to {to:g}' if mb else ''} so written blocks live until "
            f"they are reused, or turn it off (--kv-offload-mb 0) to save the "
            f"{ms(wasted):.1f} ms of copies never read back."
        )
    if value > 0 and mb and to is not None:
        action = run_action(
            "ttft.p50",
            Setting("engine.kv_offload_mb", mb, to),
            expect=f"fewer wasted copies ({ms(wasted):.1f} ms now)",
        )
    evidence = (
        ev("offloaded", "blocks written to the host tier", s.offloaded_blocks, "blocks"),
        ev("evicted_unused", "evicted without a restore", s.evicted_unused, "blocks"),
        ev("restored_blocks", "prefix tokens restored", s.host_tokens, "tokens"),
        ev("offload_ms", "copies to the host tier", ms(s.offload_s), "ms"),
        ev("wasted_ms", "copies never read back", ms(wasted), "ms"),
        ev("host_mb", "host tier", mb, "MiB"),
        ev("peak_blocks", "host blocks in use at most", s.host_blocks_peak, "blocks"),
        ev("source", "evidence", source),
        ev("advice", "advice", advice),
    )
    return Fact(value, evidence, impact=min(1.0, value * 0.5), action=action)
