"""Facts about a server perfdiag drove but did not write (`perfdiag run --target/--launch`),
from the server's own /metrics over the run's requests (analyzers/server_metrics.py) and
its launch arguments (analyzers/server_settings.py), beside the client's timing.

Each fact says where its figures come from (evidence `source`): "server metrics (names)",
"launch arguments", "client". Where the server does not export what a fact needs, the fact
is Unavailable with that reason: a missing series is never read as zero.
"""

from __future__ import annotations

import math

import numpy as np

from ..analyzers.actions import Setting, run_action
from ..analyzers.server_metrics import ServerMetrics, server_metrics
from ..analyzers.server_settings import ServerSettings
from .facts import Fact, TriageContext, Unavailable, ev, fact, ms, share

# A gauge "at" a level: the share of scrapes with requests waiting in which it held.
HELD = 0.5
KV_FULL = 0.9  # KV usage from which admission waits for blocks (vLLM admits below 100 %)


def server_record(ctx: TriageContext):
    """(ServerMetrics over the run's requests, the completed ones, ServerSettings), or
    Unavailable when the run holds no scrape of the server's metrics."""
    if "server_record" in ctx.memo:
        return ctx.memo["server_record"]
    ctx.memo["server_record"] = result = _server_record(ctx)
    return result


def _server_record(ctx: TriageContext):
    m = ctx.get("metrics")
    if m is None:
        return ctx.missing("metrics")
    if m.basis != "client":
        return Unavailable("an engine run: its own record is read instead of server metrics")
    # Every request the client sent, warm-up included: the scrapes bracket the whole run,
    # so the server's histograms hold them all, and like is compared with like.
    pr = m.per_request
    ok = pr[(pr["outcome"] == "ok").to_numpy() & np.isfinite(pr["ttft_s"].to_numpy(np.float64))]
    if not len(ok):
        return Unavailable("no completed request")
    sent = pr["sent_ns"].dropna().to_numpy(np.int64)
    end = ok["sent_ns"].to_numpy(np.int64) + np.nan_to_num(ok["e2e_s"].to_numpy(np.float64)) * 1e9
    sm = server_metrics(ctx.run, int(sent.min()), int(max(end.max(), sent.max())))
    if sm is None:
        return Unavailable("the run scraped no server metrics (the server has no /metrics, "
                           "or the run was recorded with the scrape off)")  # fmt: skip
    return sm, ok, ServerSettings.of(ctx.config, sm.server)


def _need(rec, *histograms: str) -> Unavailable | None:
    if isinstance(rec, Unavailable):
        return rec
    sm = rec[0]
    lacking = [h for h in histograms if h not in sm.histograms or sm.histograms[h].count <= 0]
    if lacking:
        words = ", ".join(_WORDS.get(h, h) for h in lacking)
        return Unavailable(f"the server's metrics ({sm.server}) have no {words} histogram "
                           "with observations in the run")  # fmt: skip
    return None


_WORDS = {"queue_s": "queue-time", "prefill_s": "prefill-time", "ttft_s": "time-to-first-token",
          "itl_s": "inter-token-latency"}  # fmt: skip


def _quantile_text(sm: ServerMetrics, name: str, q: float) -> str:
    est, lo, hi = sm.histograms[name].quantile(q)
    if not math.isfinite(est):
        return "not measured"
    hi_text = "∞" if math.isinf(hi) else f"{hi * 1e3:.0f}"
    return f"{est * 1e3:.0f} ms (bucket {lo * 1e3:.0f}–{hi_text} ms)"


# -- step 3: TTFT split by the server's own record ---------------------------------------------
@fact(
    "server_ttft_parts",
    provides=("source", "ttft_ms", "server_ttft_ms", "queue_ms", "prefill_ms", "frontend_ms",
              "outside_ms", "queue_p50", "server_ttft_p50", "requests", "server_requests",
              "binding", "limit_advice"),
)  # fmt: skip
def server_ttft_parts(ctx: TriageContext) -> Fact | Unavailable:
    """The share of the client's mean TTFT the server reports as queue time (its
    `request_queue_time` histogram), with the rest split into prefill, the server's
    front end (tokenisation, IPC: its TTFT beyond queue and prefill) and the time outside
    the server (client and network: the client's TTFT beyond the server's)."""
    rec = server_record(ctx)
    lacking = _need(rec, "queue_s", "prefill_s", "ttft_s")
    if lacking is not None:
        return lacking
    sm, served, settings = rec
    h = sm.histograms
    ttft = float(served["ttft_s"].mean())
    queue, prefill, server_ttft = h["queue_s"].mean, h["prefill_s"].mean, h["ttft_s"].mean
    binding, advice = _queue_binding(sm, settings, served)
    evidence = (
        ev("source", "evidence from", sm.source("queue_s", "prefill_s", "ttft_s") + "; client"),
        ev("ttft_ms", "TTFT at the client (mean)", ms(ttft), "ms"),
        ev("server_ttft_ms", "TTFT in the server (mean)", ms(server_ttft), "ms"),
        ev("queue_ms", "server queue (mean)", ms(queue), "ms"),
        ev("prefill_ms", "server prefill (mean)", ms(prefill), "ms"),
        ev(
            "frontend_ms",
            "server front end: TTFT − queue − prefill",
            ms(server_ttft - queue - prefill),
            "ms",
        ),
        ev(
            "outside_ms",
            "outside the server's record: client − server TTFT",
            ms(ttft - server_ttft),
            "ms",
        ),
        ev("queue_p50", "server queue p50 (from buckets)", _quantile_text(sm, "queue_s", 0.5)),
        ev("server_ttft_p50", "server TTFT p50 (from buckets)", _quantile_text(sm, "ttft_s", 0.5)),
        ev("requests", "requests completed (client, warm-up included)", len(served)),
        ev("server_requests", "requests in the server's histograms", int(h["queue_s"].count)),
        ev("binding", "what held the queue", binding),
        ev("limit_advice", "advice", advice),
    )
    value = share(queue, ttft)
    return Fact(value, evidence, impact=value if math.isfinite(value) else 0.0)


def _queue_binding(sm: ServerMetrics, settings: ServerSettings, served) -> tuple[str, str]:
    """What held requests waiting, from the gauges at scrapes where some waited."""
    waiting, running = sm.gauge("waiting"), sm.gauge("running")
    if waiting is None or running is None or not (waiting > 0).any():
        return "not seen (no scrape caught a request waiting)", "No limit to raise was seen."
    cap = _cap(sm, settings)
    at_cap = _held_at(sm, cap)
    kv = sm.gauge("kv_usage")
    queued = waiting > 0
    kv_full = float((kv[queued] >= KV_FULL).mean()) if kv is not None else float("nan")
    if at_cap is not None and at_cap >= HELD:
        knob = settings.knob("max_num_seqs") or "the sequence cap"
        advice = f"Raise {knob} (now {cap}): see the server-seq-cap finding for a value."
        return f"the sequence cap ({knob} {cap})", advice
    if math.isfinite(kv_full) and kv_full >= HELD:
        return "KV cache capacity", "Give the KV cache more memory: see server-kv-pressure."
    budget = settings.get("max_num_batched_tokens")
    prompts = served["prompt_tokens"].to_numpy(np.float64)
    sliced = isinstance(budget, int) and bool((prompts[np.isfinite(prompts)] > budget).any())
    if sliced and _held_by_budget(sm, cap) >= HELD:
        knob = settings.knob("max_num_batched_tokens") or "the token budget"
        return (f"the token budget ({knob} {budget})",
                f"Raise {knob} (now {budget}): see the server-prefill-sliced finding.")  # fmt: skip
    return "no single limit (arrivals above the server's throughput)", (
        "Lower the offered load or add capacity; find the capacity with perfdiag capacity."
    )


def _cap(sm: ServerMetrics, settings: ServerSettings) -> int | None:
    cap = settings.get("max_num_seqs")
    if cap is None and sm.gauge("max_running") is not None:
        cap = int(sm.gauge("max_running").max())
    return int(cap) if isinstance(cap, int | float) else None


def _queued(sm: ServerMetrics):
    """(running per scrape, which scrapes found requests waiting); None without gauges."""
    waiting, running = sm.gauge("waiting"), sm.gauge("running")
    if waiting is None or running is None:
        return None
    return running, (waiting > 0).reindex(running.index, fill_value=False)


def _held_at(sm: ServerMetrics, cap: int | None) -> float | None:
    """Share of the scrapes with requests waiting in which `running` was at `cap`."""
    got = _queued(sm)
    if cap is None or got is None or not got[1].any():
        return None
    running, queued = got
    return float((running[queued] >= cap).mean())


@fact(
    "server_seq_cap",
    provides=("source", "cap", "cap_source", "held_pct", "waiting_mean", "waiting_peak",
              "queue_ms", "ttft_ms", "suggested", "kv_concurrency", "advice"),
)  # fmt: skip
def server_seq_cap(ctx: TriageContext) -> Fact | Unavailable:
    """The share of the client's mean TTFT spent in the server's queue while the server ran
    as many requests as its sequence cap allows (the cap, not the hardware, held them).
    In a closed loop with more clients than the cap the queue is structural."""
    rec = server_record(ctx)
    lacking = _need(rec, "queue_s")
    if lacking is not None:
        return lacking
    sm, served, settings = rec
    cap = _cap(sm, settings)
    if cap is None:
        return Unavailable("the server's sequence cap is not recorded (launch it with perfdiag "
                           "run --launch, or its metrics do not state it)")  # fmt: skip
    held = _held_at(sm, cap)
    if held is None:
        return Unavailable("no scrape caught a request waiting (no queue to attribute)")
    waiting, running = sm.gauge("waiting"), sm.gauge("running")
    peak = int((running + waiting.reindex(running.index, fill_value=0)).max())
    ttft = float(served["ttft_s"].mean())
    queue = sm.histograms["queue_s"].mean
    value = share(queue * held, ttft)
    concurrency = settings.get("kv_cache_max_concurrency")
    suggested = max(peak, cap + 1)
    knob = settings.knob("max_num_seqs") or "the sequence cap"
    advice = f"{knob} {suggested} (now {cap}; {peak} requests were in the server at the peak)"
    if isinstance(concurrency, int | float) and concurrency < suggested:
        advice += (f"; the KV cache holds about {concurrency:.0f} full-length requests, so give "
                   "it more memory too or expect preemptions")  # fmt: skip
    evidence = (
        ev(
            "source",
            "evidence from",
            sm.source("queue_s", "running", "waiting")
            + "; "
            + f"cap from {settings.source('max_num_seqs')}",
        ),
        ev("cap", "sequence cap", cap),
        ev("cap_source", "cap stated by", settings.source("max_num_seqs")),
        ev("held_pct", "scrapes with a queue where running was at the cap", held, "%"),
        ev("waiting_mean", "requests waiting (mean over scrapes)", float(waiting.mean())),
        ev("waiting_peak", "requests waiting (peak)", int(waiting.max())),
        ev("queue_ms", "server queue (mean)", ms(queue), "ms"),
        ev("ttft_ms", "TTFT at the client (mean)", ms(ttft), "ms"),
        ev("suggested", "a cap to try", suggested),
        ev(
            "kv_concurrency",
            "full-length requests the KV cache holds",
            concurrency if concurrency is not None else "not stated",
        ),
        ev("advice", "advice", advice),
    )
    expect = f"the queue held by the cap ({ms(queue * held):.0f} ms a request) gone"
    action = server_action(settings, "ttft.p50", "max_num_seqs", cap, suggested, expect)
    return Fact(value, evidence, impact=value if math.isfinite(value) else 0.0, action=action)


def server_action(settings: ServerSettings, target: str, name: str, now, to, expect: str):
    """A relaunch with vLLM's flag changed (verify-advice); None for other servers, whose
    flags differ."""
    if settings.kind != "vllm":
        return None
    return run_action(target, Setting(f"server.{name}", now, to), expect=expect)


# -- step 4: KV pressure --------------------------------------------------------------------
@fact(
    "server_kv_pressure",
    provides=("source", "preemptions", "requests", "kv_peak_pct", "kv_full_pct",
              "capacity_waiting_pct", "num_blocks", "block_size", "advice"),
)  # fmt: skip
def server_kv_pressure(ctx: TriageContext) -> Fact | Unavailable:
    """Preemptions per finished request, from the server's own counter: running requests
    evicted because the KV cache ran out of blocks (their work is redone or waits)."""
    rec = server_record(ctx)
    if isinstance(rec, Unavailable):
        return rec
    sm, served, settings = rec
    if "preemptions" not in sm.counters:
        return Unavailable(f"the server's metrics have no preemption counter ({sm.server})")
    finished = sm.counters.get("requests_finished") or float(len(served))
    preemptions = sm.counters["preemptions"]
    kv = sm.gauge("kv_usage")
    kv_peak = float(kv.max()) if kv is not None and len(kv) else float("nan")
    kv_full = float((kv >= KV_FULL).mean()) if kv is not None and len(kv) else float("nan")
    cap_wait = sm.gauge("waiting_capacity")
    capacity_share = (float((cap_wait > 0).mean()) if cap_wait is not None and len(cap_wait)
                      else float("nan"))  # fmt: skip
    blocks, block = settings.get("num_blocks"), settings.get("block_size")
    need = _blocks_needed(block, served, sm)
    advice = _kv_advice(ctx, settings, blocks, block, need)
    evidence = (
        ev("source", "evidence from", sm.source("preemptions", "kv_usage", "waiting_capacity")),
        ev("preemptions", "preemptions", int(preemptions)),
        ev("requests", "requests finished (server)", int(finished)),
        ev("kv_peak_pct", "KV cache usage (peak)", kv_peak, "%"),
        ev("kv_full_pct", f"scrapes with KV usage ≥ {KV_FULL:.0%}", kv_full, "%"),
        ev(
            "capacity_waiting_pct",
            "scrapes with requests waiting for capacity",
            capacity_share,
            "%",
        ),
        ev("num_blocks", "KV blocks", blocks if blocks is not None else "not stated"),
        ev("block_size", "tokens per block", block if block is not None else "not stated"),
        ev("advice", "advice", advice),
    )
    value = preemptions / finished if finished > 0 else 0.0
    action = None
    if "num_gpu_blocks_override" in settings.args and need is not None:
        action = server_action(settings, "e2e.p50", "num_gpu_blocks_override", blocks, need[0],
                               "no preemption; no request's work done twice")  # fmt: skip

    return Fact(value, evidence, impact=min(1.0, value), action=action)


def _blocks_needed(block, served, sm) -> tuple[int, int, int] | None:
    """(blocks, peak running, blocks per request) for the peak of running requests at
    their longest (prompt + output); None without what it takes."""
    running = sm.gauge("running")
    peak = int(running.max()) if running is not None and len(running) else 0
    tokens = (served["prompt_tokens"].to_numpy(np.float64)
              + served["output_tokens"].to_numpy(np.float64))  # fmt: skip
    tokens = tokens[np.isfinite(tokens)]
    if not (isinstance(block, int) and block > 0 and peak and len(tokens)):
        return None
    per_request = math.ceil(float(tokens.max()) / block)
    return peak * per_request, peak, per_request


def _kv_advice(ctx, settings: ServerSettings, blocks, block, need) -> str:
    on_gpu = bool(ctx.run.manifest.environment.get("gpus"))
    knob = settings.kv_knob(on_gpu) or "the KV cache's memory"
    if not (isinstance(blocks, int) and need is not None):
        return f"Give the KV cache more memory ({knob}), or lower the sequence cap."
    needed, peak, per_request = need
    load = (f"{needed} blocks of {block} tokens ({peak} requests × {per_request} blocks at "
            "their longest)")  # fmt: skip
    if "num_gpu_blocks_override" in settings.args:  # the launch capped the pool, not memory
        override = settings.knob("num_blocks") or "the block-count override"
        advice = f"{override} {needed} or drop it (now {blocks}): the load needs about {load}"
    else:
        advice = f"{knob}: room for about {load}, against {blocks} now"
        kv_bytes = settings.get("kv_cache_memory_bytes")
        if isinstance(kv_bytes, int | float) and kv_bytes > 0 and blocks > 0:
            want = kv_bytes * needed / blocks
            advice += f" (≈ {want / 2**30:.2f} GiB of KV cache, {kv_bytes / 2**30:.2f} GiB now)"
    return advice + "; or lower the sequence cap so fewer requests share the pool."


# -- step 3: prompts sliced by the token budget -----------------------------------------------
@fact(
    "server_budget_slicing",
    provides=("source", "budget", "prompt_tokens", "steps_per_prompt", "step_ms", "extra_ms",
              "priced_by", "full_pct", "held_ms", "prefill_ms", "ttft_ms", "suggested",
              "advice"),
)  # fmt: skip
def server_budget_slicing(ctx: TriageContext) -> Fact | Unavailable:
    """The share of the client's mean TTFT that the server's per-step token budget costs
    when it cuts prompts into several steps: the extra steps, priced roofline-shaped where
    the server's prefill histogram allows (`_slice_extra_s`), else each beyond the first
    at the server's median inter-token latency (an upper bound: a step's fixed part —
    weights read, launch, the running decodes), and the queue while steps were full (a
    budget smaller than a prompt caps the prefill tokens the server takes per step, so
    while requests wait with the sequence cap and the KV cache not reached, they wait for
    it)."""
    rec = server_record(ctx)
    lacking = _need(rec, "itl_s")
    if lacking is not None:
        return lacking
    sm, served, settings = rec
    budget = settings.get("max_num_batched_tokens")
    if not isinstance(budget, int) or budget <= 0:
        return Unavailable("the server's token budget is not recorded (launch it with perfdiag "
                           "run --launch)")  # fmt: skip
    prompts = served["prompt_tokens"].to_numpy(np.float64)
    prompts = prompts[np.isfinite(prompts)]
    if not len(prompts):
        return Unavailable("the run records no prompt lengths")
    steps = np.ceil(prompts / budget)
    step_s = sm.histograms["itl_s"].quantile(0.5)[0]  # a step that adds one token
    prefill = sm.histograms["prefill_s"].mean if "prefill_s" in sm.histograms else float("nan")
    extra, priced_by = _slice_extra_s(prompts, budget, step_s, prefill)
    ttft = float(served["ttft_s"].mean())
    full = _held_by_budget(sm, _cap(sm, settings))
    sliced = bool((steps > 1).any())
    queue = sm.histograms["queue_s"].mean if "queue_s" in sm.histograms else 0.0
    held = queue * full if sliced and math.isfinite(full) else 0.0
    value = share(extra + held, ttft)
    longest = int(np.max(prompts))
    suggested = max(budget * 2, 1 << math.ceil(math.log2(longest + 64)))
    knob = settings.knob("max_num_batched_tokens") or "the token budget"
    advice = (f"{knob} {suggested} (now {budget}; prompts up to {longest} tokens then fit one "
              "step). A larger budget lengthens the steps that running decodes share: "
              f"{settings.knob('long_prefill_token_threshold') or 'a per-request prefill cap'} "
              "keeps long prompts from filling whole steps if ITL suffers")  # fmt: skip
    evidence = (
        ev(
            "source",
            "evidence from",
            f"launch arguments (budget); {sm.source('itl_s', 'prefill_s', 'waiting', 'running')}; "
            "client (prompt lengths)",
        ),
        ev("budget", "tokens per step (budget)", budget),
        ev("prompt_tokens", "prompt tokens (mean)", float(prompts.mean())),
        ev("steps_per_prompt", "steps per prompt (mean)", float(steps.mean())),
        ev("step_ms", "a step without prefill (server ITL p50)", ms(step_s), "ms"),
        ev("extra_ms", "extra steps' cost per request", ms(extra), "ms"),
        ev("priced_by", "extra steps priced by", priced_by),
        ev("full_pct", "scrapes with a queue held by neither cap nor KV", full, "%"),
        ev("held_ms", "queue the budget held (mean)", ms(held), "ms"),
        ev("prefill_ms", "server prefill (mean)", ms(prefill), "ms"),
        ev("ttft_ms", "TTFT at the client (mean)", ms(ttft), "ms"),
        ev("suggested", "a budget to try", suggested),
        ev("advice", "advice", advice),
    )
    action = None
    if sliced:
        expect = f"prompts in one step; about {ms(extra + held):.0f} ms less TTFT"
        action = server_action(
            settings, "ttft.p50", "max_num_batched_tokens", budget, suggested, expect
        )
    return Fact(value, evidence, impact=value if math.isfinite(value) else 0.0, action=action)


def _slice_extra_s(prompts, budget: int, step_s: float, prefill_s: float) -> tuple[float, str]:
    """Mean extra prefill time per request that slicing at `budget` costs, and what priced
    it. Roofline-shaped: a step of n prompt tokens costs max(D, c·n), D = the ITL p50 (a
    step bound by reading the weights and its overheads) and c the compute cost of a token,
    solved so that the prompts' steps add up to the server's mean prefill time (an upper
    bound on c: that time also holds the other work of its steps). A prompt of L tokens
    then pays Σ max(D, c·n_k) − max(D, c·L) for its slices, at most (steps − 1)·D. Where
    the prefill time is no longer than a decode step per slice (no compute to find), or
    not recorded, each extra step is priced at D: the bound."""
    steps = np.ceil(prompts / budget)
    bound = float(np.mean(steps - 1)) * step_s
    words = "server ITL p50 per extra step (an upper bound)"
    if not (math.isfinite(prefill_s) and prefill_s > 0 and step_s > 0):
        return bound, words
    full, rest = np.floor(prompts / budget), np.mod(prompts, budget)

    def sliced(c):  # mean Σ max(D, c·n_k) over the prompts
        return float(np.mean(full * max(step_s, c * budget)
                             + np.where(rest > 0, np.maximum(step_s, c * rest), 0.0)))  # fmt: skip

    if prefill_s <= sliced(0.0):  # every slice no slower than a decode step
        return bound, words
    lo, hi = 0.0, prefill_s / max(float(np.min(prompts)), 1.0)
    for _ in range(60):  # sliced() is monotone in c
        lo, hi = (lo, (lo + hi) / 2) if sliced((lo + hi) / 2) >= prefill_s else ((lo + hi) / 2, hi)
    c = (lo + hi) / 2
    extra = sliced(c) - float(np.mean(np.maximum(step_s, c * prompts)))
    return max(min(extra, bound), 0.0), (
        f"a roofline from the server's counters: max({ms(step_s):.1f} ms (ITL p50), "
        f"{c * 1e6:.1f} µs × tokens) a step, the token cost from the mean prefill time"
    )


def _held_by_budget(sm: ServerMetrics, cap: int | None) -> float:
    """Share of the scrapes with requests waiting in which neither the sequence cap nor the
    KV cache held them: running below the cap and KV usage below full. vLLM's scheduler
    admits a waiting request unless the cap, the KV blocks or the step's token budget stop
    it, so what is left is the budget. NaN without the gauges."""
    got = _queued(sm)
    if got is None:
        return float("nan")
    running, queued = got
    if not queued.any():
        return 0.0
    free = running < cap if cap is not None else running == running
    kv = sm.gauge("kv_usage")
    if kv is not None:
        free &= (kv.reindex(running.index) < KV_FULL).fillna(True)
    return float(free[queued].mean())


def server_prefix_hits(ctx: TriageContext) -> tuple[float, float, str] | None:
    """(prompt tokens that hit, prompt tokens queried, source) from the server's counters
    over the run's requests; None when the server exports no prefix-cache counters."""
    rec = server_record(ctx)
    if isinstance(rec, Unavailable):
        return None
    sm = rec[0]
    if "prefix_hits" in sm.counters and "prefix_queries" in sm.counters:
        return (sm.counters["prefix_hits"], sm.counters["prefix_queries"],
                sm.source("prefix_hits", "prefix_queries"))  # fmt: skip
    if "prompt_tokens_cached" in sm.counters and "prompt_tokens" in sm.counters:
        return (sm.counters["prompt_tokens_cached"], sm.counters["prompt_tokens"],
                sm.source("prompt_tokens_cached", "prompt_tokens"))  # fmt: skip
    return None


def server_prefill_per_token(ctx: TriageContext) -> float:
    """Seconds of the server's prefill per prompt token it computed (its prefill histogram's
    sum over the prompt tokens not served from its cache); NaN when it does not say."""
    rec = server_record(ctx)
    if isinstance(rec, Unavailable) or "prefill_s" not in rec[0].histograms:
        return float("nan")
    sm = rec[0]
    computed = sm.counters.get("prompt_tokens", 0.0) - sm.counters.get("prompt_tokens_cached", 0.0)
    return sm.histograms["prefill_s"].sum / computed if computed > 0 else float("nan")


def server_batches(ctx: TriageContext) -> int | None:
    """The most requests the server's own gauge showed running at once (None: no gauge)."""
    rec = server_record(ctx)
    if isinstance(rec, Unavailable):
        return None
    running = rec[0].gauge("running")
    return int(running.max()) if running is not None and len(running) else None
