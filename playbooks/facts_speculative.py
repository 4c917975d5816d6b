"""Facts of step 4 for speculative decoding (analyzers/speculative.py): what the target
accepted, whether a step with drafting and verification paid for itself and what ate it,
and the K the measured acceptance and costs favour. Runs without the spec_* counters (or,
for a server, its spec_decode counters) are not evaluated: nothing is inferred from an
absent column."""

from __future__ import annotations

import dataclasses
import json
import math

from ..analyzers import speculative as spec
from ..analyzers.actions import Setting, run_action
from ..analyzers.run_config import section
from .facts import Fact, TriageContext, Unavailable, ev, fact, finite

_NONE = "the run recorded no speculative decoding (no spec_* counters)"
ENGINE_SOURCE = "engine counters (spec_drafted, spec_accepted, spec_emitted) and phase spans"


def summary(ctx: TriageContext):
    """(SpecSummary, its evidence source) or Unavailable; memoised per context."""
    if "spec_summary" not in ctx.memo:
        ctx.memo["spec_summary"] = _summary(ctx)
    return ctx.memo["spec_summary"]


def _summary(ctx: TriageContext):
    if spec.has_speculation(ctx.run):
        base, base_tps = _baseline(ctx)
        m = ctx.get("metrics")
        tps = m.throughput.output_tokens_per_s if m is not None else None
        s = spec.summarize(ctx.run, base, base_tps, tps if base_tps else None)
        if s is not None:
            return s, ENGINE_SOURCE
    from .facts_target import server_record  # a --target run: the server's own counters

    rec = server_record(ctx)
    if not isinstance(rec, Unavailable):
        s = spec.from_server(rec[0], _launched_spec(ctx))
        if s is not None:
            names = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens",
                     "spec_accepted_by_position", "generation_tokens",
                     "requests_finished")  # fmt: skip
            return _server_speedup(ctx, s), rec[0].source(*names)
    return Unavailable(_NONE)


def _launched_spec(ctx: TriageContext) -> dict:
    """vLLM's `--speculative-config` as the launch recorded it ({} for a server started
    elsewhere, or launched without it)."""
    launch = section(ctx.config, "server").get("launch")
    args = launch.get("args") if isinstance(launch, dict) else None
    conf = args.get("speculative_config") if isinstance(args, dict) else None
    return conf if isinstance(conf, dict) else {}


def _server_speedup(ctx: TriageContext, s: spec.SpecSummary) -> spec.SpecSummary:
    """With a baseline run of the same load against the server without speculation, the
    measured speedup (output tokens/s at the client, both runs)."""
    b = ctx.baseline
    if b is None or spec.has_speculation(b.run):
        return s
    from .facts_target import server_record

    rec = server_record(b)
    if not isinstance(rec, Unavailable) and spec.from_server(rec[0]) is not None:
        return s  # the baseline speculated too: not a run without it
    m, bm = ctx.get("metrics"), b.get("metrics")
    if m is None or bm is None:
        return s
    tps, base = m.throughput.output_tokens_per_s, bm.throughput.output_tokens_per_s
    if not (finite(tps) and finite(base) and base > 0):
        return s
    s = spec.priced_from_chunks(s, m.itl_per_chunk_s.mean, bm.itl_per_chunk_s.mean)
    return dataclasses.replace(s, tokens_per_s=tps, baseline_tokens_per_s=base,
                               measured_speedup=tps / base)  # fmt: skip


def _baseline(ctx: TriageContext):
    """The baseline run and its output tokens/s, when it ran without speculation."""
    b = ctx.baseline
    if b is None or spec.has_speculation(b.run):
        return None, None
    m = b.get("metrics")
    return b.run, (m.throughput.output_tokens_per_s if m is not None else None)


def spelling(s: spec.SpecSummary, k: int) -> str:
    """engine_ref's `--speculative` value for this method at K."""
    if s.method == "draft" and s.draft:
        return f"draft:{s.draft}:{k}"
    return f"{s.method or 'ngram'}:{k}"


def vllm_spelling(s: spec.SpecSummary, k: int, launched: dict | None = None) -> str:
    """vLLM's `--speculative-config` for the same method at K: the launched one with only
    num_speculative_tokens changed, when the run launched vLLM with one."""
    if launched:
        return f"--speculative-config '{json.dumps({**launched, 'num_speculative_tokens': k})}'"
    conf = {"method": "ngram" if s.method != "draft" else "draft_model"}
    if s.method == "draft" and s.draft:
        conf["model"] = s.draft
    conf["num_speculative_tokens"] = k
    return f"--speculative-config '{json.dumps(conf)}'"


def _recorded(ctx: TriageContext, s: spec.SpecSummary):
    """The `--speculative` value as the run recorded it (its options), else spelled."""
    now = section(ctx.config, "run_options", "engine").get("speculative")
    return now if isinstance(now, str) and now else spelling(s, s.k)


def _k_action(ctx: TriageContext, s: spec.SpecSummary):
    """The best K as a re-run, when the run's engine is perfdiag's and it predicts a gain."""
    if s.best_k is None or s.best_k == s.k or ctx.config.get("target"):
        return None
    expect = (f"{s.best_speedup:.2f}× the tokens/s of no speculation (now predicted "
              f"{s.predicted_speedup:.2f}×)")  # fmt: skip
    setting = Setting("engine.speculative", _recorded(ctx, s), spelling(s, s.best_k))
    return run_action("throughput.output", setting, expect=expect)


def _no_costs(source: str) -> str:
    if source != ENGINE_SOURCE:  # a server's counters
        return ("a server's spec_decode counters carry no draft or verify times, so what a "
                "step costs is unknown (with analyze --baseline of the same load without "
                "--speculative-config, spec-acceptance gives the measured speedup)")  # fmt: skip
    return "the run recorded no draft phase: the step's costs are unknown"


def _common(s: spec.SpecSummary, source: str) -> tuple:
    method = f"{s.method}, K = {s.k}" if s.method else f"K = {s.k}"
    positions = ", ".join(f"{x:.0%}" for x in s.position_acceptance if x == x) or None
    return (
        ev("method", "method", method),
        ev("acceptance", "draft tokens accepted (accepted / drafted)", s.acceptance, "%"),
        ev("alpha", "acceptance per position tried (the model's α)", s.alpha, "%"),
        ev("mean_accepted", "accepted drafts per verify", s.mean_accepted),
        ev("tokens_per_forward", "tokens per target forward (per request)",
           s.tokens_per_forward),
        ev("expected_tokens", "expected at α and K (Leviathan et al.)", s.expected_tokens),
        ev("by_position", "accepted through position 0, 1, …", positions),
        ev("draft_fill", "drafts offered of K", s.draft_fill, "%"),
        *((ev("drafted_steps", "decode steps with a draft (the rest decode one token)",
              s.drafted_steps, "%"),) if finite(s.drafted_steps) else ()),
        ev("verifies", "request verifications", s.verifies),
        ev("source", "evidence", source),
    )  # fmt: skip


def _costs(s: spec.SpecSummary) -> tuple:
    return (
        ev("draft_ms", "draft phase per step", s.draft_ms, "ms"),
        ev("verify_ms", "verify forward + rejection sampling per step", s.verify_ms, "ms"),
        ev("plain_ms", "a forward without drafts, same batch", s.plain_forward_ms, "ms"),
        ev("plain_source", "measured from", s.plain_source),
        ev("other_ms", "the rest of the step", s.other_ms, "ms"),
        ev("c", "draft cost per position / target forward (c)", s.c),
        ev("v", "verify's extra per draft position / target forward", s.v),
        ev("leviathan", "expected speedup E / (1 + K·c)", s.leviathan_speedup, "×"),
        ev("predicted", "predicted speedup with this run's verify and host costs",
           s.predicted_speedup, "×"),
        ev("best_k", "best K (argmax over 1..16)", s.best_k),
        ev("best_speedup", "its predicted speedup", s.best_speedup, "×"),
    )  # fmt: skip


@fact(
    "spec_acceptance",
    provides=("method", "acceptance", "alpha", "mean_accepted", "tokens_per_forward",
              "expected_tokens", "by_position", "draft_fill", "drafted_steps", "verifies", "source",
              "modelled", "predicted", "measured"),
)  # fmt: skip
def spec_acceptance(ctx: TriageContext) -> Fact | Unavailable:
    """Acceptance rate (accepted / drafted) of the run's speculative decoding, from the
    engine's counters or the server's own spec_decode counters."""
    got = summary(ctx)
    if isinstance(got, Unavailable):
        return got
    s, source = got
    evidence = (
        *_common(s, source),
        ev(
            "modelled",
            "speedup from this run's steps (tokens per forward × plain / its step)",
            s.modelled_speedup,
            "×",
        ),
        ev("predicted", "predicted at K with full drafts (the model)", s.predicted_speedup, "×"),
        ev("measured", "measured speedup against the baseline", s.measured_speedup, "×"),
    )
    return Fact(s.acceptance, evidence)


@fact(
    "spec_no_speedup",
    provides=("method", "acceptance", "alpha", "mean_accepted", "tokens_per_forward",
              "expected_tokens", "by_position", "draft_fill", "drafted_steps", "verifies", "source",
              "draft_ms", "verify_ms", "plain_ms", "plain_source", "other_ms", "c", "v",
              "leviathan", "predicted", "best_k", "best_speedup", "speedup",
              "speedup_source", "eaten_by", "eaten_ms", "other_cost_ms", "gained",
              "break_even_c", "advice"),
)  # fmt: skip
def spec_no_speedup(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the throughput speculative decoding lost against decoding without it:
    1 − speedup, the speedup measured against a baseline run of the same load when one is
    given, else from this run's step times (tokens per forward × a plain step / the
    speculative step)."""
    got = summary(ctx)
    if isinstance(got, Unavailable):
        return got
    s, source = got
    if not finite(s.modelled_speedup):
        return Unavailable(_no_costs(source))
    if finite(s.measured_speedup):
        speedup, how = s.measured_speedup, "measured: output tokens/s against the baseline run"
    else:
        speedup = s.modelled_speedup
        how = "this run's steps: tokens per forward × a plain step / its step"
    verify_extra = max(s.verify_ms - s.plain_forward_ms, 0.0)
    eaten, other = ("draft time", "verify time")
    eaten_ms, other_ms = s.draft_ms, verify_extra
    if verify_extra > s.draft_ms:
        eaten, other, eaten_ms, other_ms = "verify time", "draft time", verify_extra, s.draft_ms
    if source != ENGINE_SOURCE:  # a server: only its steps' length, seen from the client
        eaten, other = "draft and verify time (the server does not time them apart)", "rest"
        eaten_ms, other_ms = s.step_ms - s.plain_forward_ms, float("nan")
    positions = max(s.k * s.draft_fill, 1.0)
    # The c at which this K just pays: E(1+o) = 1 + o + K(c + v).
    break_even = (s.tokens_per_forward - 1) * (1 + s.o) / positions - s.v
    value = max(0.0, 1.0 - speedup)
    evidence = (
        *_common(s, source),
        *_costs(s),
        ev("speedup", "speedup", speedup, "×"),
        ev("speedup_source", "speedup from", how),
        ev("eaten_by", "what eats the gain", eaten),
        ev("eaten_ms", f"{eaten} per step", eaten_ms, "ms"),
        ev("other_cost_ms", f"{other} per step", other_ms, "ms"),
        ev("gained", "tokens gained per request per step", s.tokens_per_forward - 1),
        ev("break_even_c", "c at which this K breaks even", break_even),
        ev("advice", "advice", _no_speedup_advice(s, eaten, break_even, _server(ctx, source))
           if value else ""),
    )  # fmt: skip
    action = _k_action(ctx, s) if s.best_speedup > max(1.0, s.predicted_speedup) else None
    return Fact(value, evidence, impact=min(1.0, value), action=action)


def _server(ctx: TriageContext, source: str) -> dict | None:
    """The launched --speculative-config ({} when not known) for a server's run; None for
    engine_ref's."""
    return None if source == ENGINE_SOURCE else _launched_spec(ctx)


def _no_speedup_advice(s: spec.SpecSummary, eaten: str, break_even: float,
                       server: dict | None = None) -> str:  # fmt: skip
    if server is not None:
        if s.best_k is not None and s.best_k != s.k and s.best_speedup > 1.0:
            return (
                f"Launch vLLM with {vllm_spelling(s, s.best_k, server)} (now "
                f"num_speculative_tokens = {s.k}): at α {s.alpha:.0%} and c {s.c:.2f} it is "
                f"predicted {s.best_speedup:.2f}× the tokens/s without speculation (now "
                f"{s.predicted_speedup:.2f}×)."
            )
        return (
            f"Launch vLLM without --speculative-config: no num_speculative_tokens in 1..16 "
            f"pays at α {s.alpha:.0%} with these costs (best {s.best_k} predicts "
            f"{s.best_speedup:.2f}×)."
        )
    if s.best_k is not None and s.best_k != s.k and s.best_speedup > 1.0:
        return (
            f"Use --speculative {spelling(s, s.best_k)} (now {spelling(s, s.k)}): at α "
            f"{s.alpha:.0%} and c {s.c:.2f} it is predicted {s.best_speedup:.2f}× the tokens/s "
            f"without speculation (now {s.predicted_speedup:.2f}×); on vLLM "
            f"{vllm_spelling(s, s.best_k)}."
        )
    if eaten == "draft time" and s.method == "draft":
        return (
            f"The draft costs {s.c:.2f} of a target forward per token; at this acceptance it "
            f"pays only below {max(break_even, 0.0):.2f}: use a faster draft (smaller, "
            f"quantised) or run without --speculative (no K in 1..16 pays: best K "
            f"{s.best_k} predicts {s.best_speedup:.2f}×)."
        )
    return (
        f"Run without --speculative: no K in 1..16 pays at α {s.alpha:.0%} with these costs "
        f"(best K {s.best_k} predicts {s.best_speedup:.2f}×)."
    )


@fact(
    "spec_k_gain",
    provides=("method", "acceptance", "alpha", "mean_accepted", "tokens_per_forward",
              "expected_tokens", "by_position", "draft_fill", "drafted_steps", "verifies", "source",
              "draft_ms", "verify_ms", "plain_ms", "plain_source", "other_ms", "c", "v",
              "leviathan", "predicted", "best_k", "best_speedup", "k", "advice"),
)  # fmt: skip
def spec_k_gain(ctx: TriageContext) -> Fact | Unavailable:
    """Predicted throughput gain of the K that the measured α and costs favour over the
    run's K (best speedup / the run's − 1), when that K beats decoding without drafts."""
    got = summary(ctx)
    if isinstance(got, Unavailable):
        return got
    s, source = got
    if s.best_k is None or not finite(s.best_gain):
        return Unavailable(_no_costs(source))
    pays = s.best_k != s.k and s.best_speedup > 1.0
    value = s.best_gain if pays else 0.0
    advice = ""
    server = _server(ctx, source)
    if pays and server is not None:  # a server: its own flag
        advice = (
            f"Launch vLLM with {vllm_spelling(s, s.best_k, server)} (now num_speculative_tokens = "
            f"{s.k}): predicted {s.best_speedup:.2f}× the tokens/s of no speculation against "
            f"{s.predicted_speedup:.2f}× now (+{s.best_gain:.0%})."
        )
    elif pays:
        advice = (
            f"Set --speculative {spelling(s, s.best_k)} (now {spelling(s, s.k)}): predicted "
            f"{s.best_speedup:.2f}× the tokens/s of no speculation against "
            f"{s.predicted_speedup:.2f}× now (+{s.best_gain:.0%}); on vLLM "
            f"{vllm_spelling(s, s.best_k)}."
        )
    evidence = (
        *_common(s, source),
        *_costs(s),
        ev("k", "K now", s.k),
        ev("advice", "advice", advice),
    )
    action = _k_action(ctx, s) if pays else None
    return Fact(value, evidence, impact=min(1.0, value), action=action)


def elem_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def block_bytes(model: dict, block: int, dtype: str, kv_dtype: str) -> int | None:
    """Bytes of one KV block as stored: K and V of `block` tokens in every layer; int8 /
    fp8 one byte per element plus one fp32 scale per (token, KV head) (engine_ref/
    kv_quant.py's granularity)."""
    try:
        layers = int(model.get("num_layers") or model["num_hidden_layers"])
        heads = int(model.get("num_heads") or model.get("num_attention_heads") or 1)
        kv = int(model.get("num_kv_heads") or model.get("num_key_value_heads") or heads)
        d = int(model.get("head_dim") or 0) or int(model["hidden_size"]) // heads
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    per = d + 4 if kv_dtype in ("int8", "fp8") else d * elem_bytes(dtype)
    return 2 * layers * block * kv * per


@fact(
    "kv_quant_tradeoff",
    provides=("kv_dtype", "model_dtype", "bytes_now", "bytes_quant", "ratio", "blocks",
              "blocks_then", "problem", "summary", "advice"),
)  # fmt: skip
def kv_quant_tradeoff(ctx: TriageContext) -> Fact | Unavailable:
    """With the KV cache in the model's dtype and the pool the problem (preemptions per
    request, or the share of steps admission waited on a full pool): that share, and the
    capacity int8 would add in the same memory. With a quantised cache: 0, and what it
    bought."""
    from ..analyzers.roofline import _run_dtype, find_model_config
    from ..analyzers.scheduler import pool_blocks
    from .facts import evaluate_fact

    if ctx.config.get("target"):
        return Unavailable("a server's KV dtype is its own launch setting (see server-kv-pressure)")
    cache = section(ctx.config, "engine_config", "cache")
    kv_dtype = str(cache.get("kv_dtype") or "auto")
    dtype = _run_dtype(ctx.config)
    model = find_model_config(ctx.config) or {}
    bsz = ctx.engine_setting("block_size", "cache", "block_size") or 16
    now = block_bytes(model, bsz, dtype, kv_dtype)
    quant = block_bytes(model, bsz, dtype, "int8")
    plain = block_bytes(model, bsz, dtype, "auto")
    blocks = pool_blocks(ctx.run.steps)
    if now is None or quant is None or not blocks:
        return Unavailable("the run recorded no model shape or KV pool")
    shares = {}
    for name, params in (("preemption_rate", {}), ("kv_full_share", {})):
        f = evaluate_fact(name, ctx, params)
        if isinstance(f, Fact) and finite(f.value):
            shares[name] = float(f.value)
    problem = max(shares.values(), default=0.0)
    base = (ev("kv_dtype", "KV cache dtype", kv_dtype), ev("model_dtype", "model dtype", dtype),
            ev("bytes_now", "bytes per block now", now),
            ev("blocks", "KV pool (blocks)", blocks))  # fmt: skip
    if kv_dtype != "auto":
        ratio = plain / now
        summary_text = (
            f"{kv_dtype} KV holds {ratio:.2f}× the blocks of {dtype} in the same memory "
            f"({blocks} blocks, {math.floor(blocks / ratio)} in {dtype})"
        )
        evidence = (
            *base,
            ev("ratio", "blocks per MB against the model dtype", ratio, "×"),
            ev("blocks_then", f"blocks in {dtype}", math.floor(blocks / ratio)),
            ev("problem", "preemptions per request / steps waiting on a full pool", problem),
            ev("summary", "summary", summary_text),
            ev("advice", "advice", (
                "It costs dequantisation in every attention read and some accuracy: compare "
                "ITL and outputs (logprobs, greedy agreement) with a run at --kv-dtype auto "
                "(perfdiag compare).")),
        )  # fmt: skip
        return Fact(0.0, evidence)
    if problem <= 0:
        return Unavailable("the KV pool neither preempted nor held admission back")
    ratio = now / quant
    fixed = ctx.engine_setting("kv_blocks", "cache", "num_gpu_blocks")
    to_blocks = math.floor(blocks * ratio)
    settings = [Setting("engine.kv_dtype", "auto", "int8")]
    how = "--kv-dtype int8"
    if fixed and ctx.run_options:  # a pool sized in blocks keeps its count: size it by memory
        settings.append(Setting("engine.kv_blocks", fixed, to_blocks))
        how += f" --kv-blocks {to_blocks}"
    advice = (
        f"Quantise the KV cache: {how} holds {to_blocks} blocks in the memory of today's "
        f"{blocks} ({ratio:.2f}×: {quant:,} bytes per block against {now:,} in {dtype}); on "
        f"vLLM --kv-cache-dtype fp8. It costs dequantisation in every attention read (ITL) and "
        f"some accuracy: verify both (perfdiag compare: ITL, logprobs, greedy agreement)."
    )
    evidence = (
        *base,
        ev("bytes_quant", "bytes per block in int8 (scales included)", quant),
        ev("ratio", "blocks per MB, int8 against now", ratio, "×"),
        ev("blocks_then", "blocks in the same memory", to_blocks),
        ev("problem", "preemptions per request / steps waiting on a full pool", problem),
        ev("summary", "summary", f"int8 KV would hold {ratio:.2f}× the blocks ({to_blocks} "
           f"instead of {blocks}) where the pool is the problem"),
        ev("advice", "advice", advice),
    )  # fmt: skip
    action = run_action("e2e.p50", *settings, expect=f"{ratio:.2f}× the KV blocks; fewer "
                        "preemptions; ITL and outputs to check")  # fmt: skip
    return Fact(problem, evidence, impact=min(1.0, problem), action=action)
