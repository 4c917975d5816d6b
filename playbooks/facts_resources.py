"""Facts of step 4 (is the CPU, the GPU, a copy or a collective what everyone waits for,
or the KV memory?) and step 5 (where do cache hits come from, what did they save?)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..analyzers.actions import Setting, other_action, run_action
from ..analyzers.findings import IdList
from ..analyzers.host import probe_stalls
from ..analyzers.loop_input import input_s_between
from ..analyzers.replicas import busiest_replica
from ..analyzers.scheduler import KV_FULL, kv_pool, pool_blocks
from ..analyzers.server_settings import ServerSettings, driven_server
from .advice import NO_ADVICE, kv_advice
from .facts import Fact, Param, TriageContext, Unavailable, ev, fact, finite, ms, share, worst
from .facts_target import server_action, server_prefill_per_token, server_prefix_hits

# One finding per cause, but the four dependencies (analyzers/gap_evidence.py) share one.
DEPENDENCIES = ("host_wait", "stream_wait", "peer_wait", "graph")
GAP_CAUSES = ("sync", "launch_delay", "host_bound", "no_work", "dependency", "unexplained",
              "unlinked")  # fmt: skip
WAITED_FOR = {
    "host_wait": "a synchronisation or event the host waited in",
    "stream_wait": "another stream's work (a stream wait event)",
    "peer_wait": "the collective's peers on other ranks",
    "graph": "the CUDA graph's earlier nodes and dependencies",
    "unexplained": "nothing the trace records",
}
_GRAPH_LAUNCH = ("cudaGraphLaunch", "hipGraphLaunch")


def _lowest_rank(steps: pd.DataFrame) -> pd.DataFrame:
    ranks = steps["rank"].dropna().unique()
    if len(ranks) > 1:
        steps = steps[steps["rank"].eq(min(ranks)).fillna(False).to_numpy()]
    replica = busiest_replica(steps)  # replicas step side by side: one replica's sequence
    if replica is not None:
        steps = steps[steps["replica"].eq(replica).fillna(False).to_numpy()]
    return steps.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _mean(values: np.ndarray) -> float:
    ok = values[np.isfinite(values)]
    return float(ok.mean()) if len(ok) else float("nan")


def _finished_per_step(ctx: TriageContext) -> pd.Series:
    e = ctx.run.request_events
    sel = (e["kind"] == "finished").to_numpy() & (e["side"] == "engine").to_numpy()
    return e[sel & e["step_id"].notna().to_numpy()]["step_id"].astype("int64").value_counts()


@fact(
    "host_share",
    provides=(
        "timing",
        "steps",
        "forward_ms",
        "host_ms",
        "gap_ms",
        "input_gap_ms",
        "schedule_ms",
        "prepare_ms",
        "post_ms",
        "sample_ms",
        "draft_ms",
        "device_pct",
    ),
)
def host_share(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the engine's busy time spent on the host rather than computing: the
    scheduler, input preparation and output processing inside steps, plus the gaps
    between steps while requests were waiting or running. Device time is the GPU time
    of each step when measured (CUDA events), else the forward and sample phases."""
    steps = ctx.run.steps
    if not len(steps):
        return Unavailable("the run has no steps table")
    s = _lowest_rank(steps)
    ids = s["step_id"].to_numpy(np.int64)
    wall = (s["end_ns"] - s["start_ns"]).to_numpy(np.float64) / 1e9
    phases = ctx.phases.reindex(ids) if len(ctx.phases) else pd.DataFrame(index=ids)

    def phase(name: str) -> np.ndarray:
        return phases[name].to_numpy(np.float64) if name in phases else np.full(len(s), np.nan)

    gpu = s["gpu_time_ns"].to_numpy("float64", na_value=np.nan) / 1e9
    if np.isfinite(gpu).all():
        timing, device, host_in = "CUDA events", gpu, np.maximum(wall - gpu, 0.0)
    elif "forward" in phases and np.isfinite(phase("forward")).any():
        timing = "engine phases"
        device = np.nan_to_num(phase("forward")) + np.nan_to_num(phase("sample"))
        host_in = sum(
            np.nan_to_num(phase(p)) for p in ("schedule", "prepare_inputs", "post_process")
        )
        # Overlapped scheduling (analyzers/host_overlap.py): the look-ahead's exposed part.
        ahead = np.nan_to_num(phase("schedule_ahead")) + np.nan_to_num(phase("prepare_ahead"))
        host_in = host_in + ahead - np.minimum(np.nan_to_num(phase("host_hidden")), ahead)
        # Speculative decoding's draft phase is judged by spec-no-speedup (what the draft
        # costs against what it gains), not here: shown as evidence, counted in neither.
    else:
        return Unavailable("the run has neither engine phases nor GPU step times")
    in_system = sum(
        s[c].to_numpy("float64", na_value=0.0)
        for c in ("num_running", "num_waiting", "num_swapped")
    )
    finished = _finished_per_step(ctx).reindex(ids, fill_value=0).to_numpy(np.float64)
    start, end = s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64)
    gap = np.zeros(len(s))
    gap[:-1] = np.maximum(start[1:] - end[:-1], 0) / 1e9
    gap = np.where(in_system - finished > 0, gap, 0.0)  # idle with nothing to do is not host time
    # The profiler's own time is the gate's (probe-stalls), never the engine's host work:
    # gaps a probe held (profiler start/stop) and the profiled steps' bookkeeping.
    gap[:-1] = np.maximum(gap[:-1] - _probe_held_s(ctx.run, end[:-1], start[1:]), 0.0)
    # Taking requests in on the loop that drives the steps holds the next step back: that
    # time is the input's (slow-input's, in TTFT), not the engine's (analyzers/loop_input.py).
    taken_in = np.zeros(len(s))
    taken_in[:-1] = input_s_between(ctx.run.request_events, end[:-1], start[1:])
    taken_in = np.minimum(taken_in, gap)
    gap = gap - taken_in
    keep = ~_profiled(ctx, ids)
    if not keep.any():
        return Unavailable("every step ran inside the profiler window")
    host, device, gap, taken_in = (host_in + gap)[keep], device[keep], gap[keep], taken_in[keep]
    value = share(host.sum(), host.sum() + device.sum())
    n = int(keep.sum())
    evidence = (
        ev("timing", "device time from", timing),
        ev("steps", "steps", n),
        ev("forward_ms", "device time per step", ms(device.mean()), "ms"),
        ev("host_ms", "host time per step (in and between steps)", ms(host.mean()), "ms"),
        ev("gap_ms", "between steps, per step", ms(gap.mean()), "ms"),
        ev("input_gap_ms", "between steps taking requests in (slow-input's, not counted)",
           ms(taken_in.mean()), "ms"),
        ev("schedule_ms", "schedule, per step", ms(_mean(phase("schedule"))), "ms"),
        ev("prepare_ms", "prepare inputs, per step", ms(_mean(phase("prepare_inputs"))), "ms"),
        ev("post_ms", "post-process, per step", ms(_mean(phase("post_process"))), "ms"),
        ev("sample_ms", "sample, per step", ms(_mean(phase("sample"))), "ms"),
        ev("draft_ms", "speculative draft, per step", _ms_or_none(phase("draft")), "ms"),
        ev("device_pct", "device share of busy time", 1.0 - value if finite(value) else None,
           "%"),
    )  # fmt: skip
    frame = pd.DataFrame({"step_id": ids[keep], "host_s": host})
    worst_steps = (
        worst(frame, "host_s", "most host time (in the step and after it)", "step", 5, "step_id"),
    )
    action = other_action(
        "code", "itl.p50", "Profile the step loop's host code; overlap it with the forward pass."
    )
    return Fact(value, evidence, worst_steps, impact=value if finite(value) else 0.0, action=action)


def _ms_or_none(values: np.ndarray) -> float | None:
    """A phase's mean in ms; None (no row) when the run has no such phase."""
    mean = _mean(values)
    return ms(mean) if finite(mean) else None


def _profiled(ctx: TriageContext, ids: np.ndarray) -> np.ndarray:
    """The steps inside the run's profiler window (they carry its bookkeeping)."""
    p = ctx.get("probe_stalls")
    if p is None or p.window_steps is None:
        return np.zeros(len(ids), dtype=bool)
    lo, hi = p.window_steps
    return (ids >= lo) & (ids <= hi)


def _probe_held_s(run, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Seconds of each interval [a, b] (ns, the run's clock) a probe held the engine."""
    held = probe_stalls(run, origin_ns=0).stalls  # origin 0: the intervals in run ns
    return held.between(a.astype(np.float64), b.astype(np.float64)) / 1e9


@fact(
    "preemption_rate",
    provides=(
        "preemptions",
        "requests",
        "recompute",
        "swap",
        "recomputed_tokens",
        "cost_ms",
        "waiting_s",
        "pool_blocks",
        "kv_peak_pct",
        "kv_advice",
    ),
)
def preemption_rate(ctx: TriageContext) -> Fact | Unavailable:
    """Preemptions per admitted request: requests thrown out of the running batch because
    the KV pool had no block for them, to be recomputed or swapped back later."""
    pre = ctx.get("preemptions")
    if pre is None:
        return ctx.missing("preemptions")
    e = ctx.run.request_events
    admitted = e[(e["kind"] == "scheduled").to_numpy()]["request_id"].nunique()
    steps = ctx.run.steps
    used, pool = kv_pool(steps)
    peak = float(np.nanmax(used / pool)) if len(steps) and np.isfinite(pool).any() else np.nan
    value = pre.count / admitted if admitted else 0.0
    evidence = (
        ev("preemptions", "preemptions", pre.count),
        ev("requests", "requests admitted", admitted),
        ev("recompute", "by recompute", pre.recompute),
        ev("swap", "by swap", pre.swap),
        ev("recomputed_tokens", "tokens recomputed", pre.recomputed_tokens),
        ev("cost_ms", "estimated recompute cost", ms(pre.recompute_cost_s), "ms"),
        ev("waiting_s", "time preempted requests waited", pre.waiting_s, "s"),
        ev("pool_blocks", "KV pool (blocks)", pool_blocks(steps)),
        ev("kv_peak_pct", "peak KV use", peak, "%"),
    )
    advice, action = kv_advice(ctx) if pre.count else NO_ADVICE
    evidence += (ev("kv_advice", "advice", advice),)
    per = pre.per_preemption
    counts = per["request_id"].value_counts().rename_axis("request_id").reset_index(name="n")
    ids = [worst(counts, "n", "preempted most often")]
    if len(steps):
        ids.append(worst(steps, "num_preempted", "most preemptions", "step", 5, "step_id"))
    return Fact(value, evidence, tuple(ids), impact=min(1.0, value), action=action)


@fact(
    "kv_full_share",
    provides=("pool_blocks", "full_pct", "waiting_when_full", "steps", "kv_advice"),
    full=Param(float, KV_FULL),
)
def kv_full_share(ctx: TriageContext, full: float) -> Fact | Unavailable:
    """Share of steps in which requests waited while the KV pool was at least `full`
    in use: admission was limited by KV memory."""
    steps = ctx.run.steps
    if not len(steps):
        return Unavailable("the run has no steps table")
    used, pool = kv_pool(steps)
    waiting = steps["num_waiting"].to_numpy("float64", na_value=np.nan)
    if not np.isfinite(pool).any() or not np.isfinite(waiting).any():
        return Unavailable("the steps table records no KV blocks or queue depths")
    is_full = (used / np.where(pool > 0, pool, np.nan) >= full) & (waiting > 0)
    value = float(is_full.mean())
    evidence = (
        ev("pool_blocks", "KV pool (blocks)", int(np.nanmax(pool))),
        ev("full_pct", "steps with the pool full and requests waiting", value, "%"),
        ev(
            "waiting_when_full",
            "mean waiting then",
            float(waiting[is_full].mean()) if is_full.any() else 0.0,
        ),
        ev("steps", "steps", len(steps)),
    )
    advice, action = kv_advice(ctx) if value > 0 else NO_ADVICE
    evidence += (ev("kv_advice", "advice", advice),)
    return Fact(value, evidence, impact=value, action=action)


def _timeline_frames(ctx: TriageContext):
    tl = ctx.timeline
    if tl is None or not len(tl.breakdown):
        return None
    return tl


@fact(
    "gpu_idle_share",
    provides=("cause", "gaps", "idle_ms", "wall_ms", "p99_gap_ms", "of_idle", "gpu_idle",
              "largest_ms", "largest_at_ms", "next_op", "launch_name", "queue_p50_us",
              "waited_for", "waited_on", "graph_advice"),
    cause=Param(str, choices=GAP_CAUSES),
)  # fmt: skip
def gpu_idle_share(ctx: TriageContext, cause: str) -> Fact | Unavailable:
    """Share of the traced time the GPU sat idle for one cause (the host was busy
    elsewhere, blocked in a synchronisation, launched late, or had no work). The evidence
    names the largest such gap (where it is, the op after it) so it can be looked at."""
    tl = _timeline_frames(ctx)
    if tl is None or not tl.gpu_ops:
        return Unavailable("the run has no GPU work in its spans (a CUDA profiler window)")
    if cause == "no_work" and _serving(ctx):
        # A serving engine's GPU waits whenever no request is ready, and its host work
        # between steps is Python the tracer does not see: the load checks (step 2) and
        # host-bound (the engine's own phases) judge those; this is for bare traces.
        return Unavailable("a serving run: its idle GPU is judged by the load and host-bound "
                           "checks, which see the requests and the engine's phases")  # fmt: skip
    wall = float(tl.breakdown["wall_ns"].sum())
    all_idle = float(tl.gaps["dur_ns"].sum()) if len(tl.gaps) else 0.0
    causes = DEPENDENCIES if cause == "dependency" else (cause,)
    g = tl.gaps[tl.gaps["cause"].isin(causes).to_numpy()] if len(tl.gaps) else tl.gaps
    idle = float(g["dur_ns"].sum()) if len(g) else 0.0
    p99 = float(np.percentile(g["dur_ns"], 99)) / 1e6 if len(g) else float("nan")
    largest_ms = largest_at = float("nan")
    next_op = launch = waited_on = ""
    waited_for = None
    if len(g):
        top = g.loc[g["dur_ns"].idxmax()]
        origin = float(tl.windows["start_ns"].min()) if len(tl.windows) else float(top.start_ns)
        largest_ms, largest_at = float(top["dur_ns"]) / 1e6, (top["start_ns"] - origin) / 1e6
        next_op = str(top["next_op"])[:80]
        launch = None if pd.isna(top["launch_name"]) else str(top["launch_name"])
        waited_for = WAITED_FOR.get(str(top["cause"]))
        waited_on = str(top.get("waited_on", ""))[:80]
    # Work a CUDA graph launched is captured already: no advice to capture it.
    graph_advice = None if launch in _GRAPH_LAUNCH else "use CUDA graphs"
    queue = float("nan")
    ls = tl.launch_stats
    if len(ls) and launch in set(ls["launch_name"].astype(str)):
        queue = float(ls.loc[ls["launch_name"].astype(str) == launch, "queue_p50_ns"].iloc[0])
    evidence = (
        ev("cause", "cause", cause.replace("_", " ")),
        ev("gaps", "gaps", len(g)),
        ev("idle_ms", "idle", idle / 1e6, "ms"),
        ev("wall_ms", "traced", wall / 1e6, "ms"),
        ev("of_idle", "of all GPU idle time", share(idle, all_idle), "%"),
        ev("gpu_idle", "GPU idle (all causes)", share(all_idle, wall), "%"),
        ev("p99_gap_ms", "gap p99", p99, "ms"),
        ev("largest_ms", "largest gap", largest_ms, "ms"),
        ev("largest_at_ms", "largest gap at (from the first step)", largest_at, "ms"),
        ev("next_op", "op after the largest gap", next_op),
        ev("launch_name", "its launch", launch),
        ev("queue_p50_us", "launch-to-start p50 of that API", queue / 1e3, "µs"),
    )
    if cause in ("dependency", "unexplained"):
        evidence += (
            ev("waited_for", "the largest gap's work waited for", waited_for),
            ev("waited_on", "its evidence", waited_on),
        )
    if cause == "host_bound":  # a field of the advice, not shown as evidence (triage.yaml)
        evidence += (ev("graph_advice", "graph advice", graph_advice),)
    value = share(idle, wall)
    return Fact(value, evidence, impact=value if finite(value) else 0.0)


def _serving(ctx: TriageContext) -> bool:
    """Whether the run serves requests (has requests or engine steps) rather than being a
    bare trace (training, or a profiler trace of unknown purpose)."""
    tables = ctx.run.manifest.tables or {}
    return any((tables.get(t) or {}).get("rows", 0) for t in ("requests", "steps"))


@fact(
    "exposed_share",
    provides=("what", "exposed_ms", "wall_ms", "overlapped_ms", "comm_advice"),
    what=Param(str, choices=("comm", "copy")),
)
def exposed_share(ctx: TriageContext, what: str) -> Fact | Unavailable:
    """Share of the traced time a collective (comm) or a copy ran without compute beside
    it: time every rank waits for communication or data movement."""
    tl = _timeline_frames(ctx)
    if tl is None:
        return Unavailable("the run has no device or collective spans")
    o = tl.overlap
    total = float(o[f"{what}_ns"].sum()) if len(o) else 0.0
    if total == 0:
        return Unavailable(f"the trace has no {what} operations")
    exposed = float(o[f"exposed_{what}_ns"].sum())
    wall = float(tl.breakdown["wall_ns"].sum())
    evidence = (
        ev("what", "what", "communication" if what == "comm" else "copies"),
        ev("exposed_ms", "exposed", exposed / 1e6, "ms"),
        ev("wall_ms", "traced", wall / 1e6, "ms"),
        ev("overlapped_ms", "hidden behind compute", (total - exposed) / 1e6, "ms"),
    )
    if what == "comm":
        advice = (
            "Fewer ranks per model replica (a lower tensor-parallel degree) if the model fits."
            if _serving(ctx)
            else "For data-parallel training, let gradient all-reduce overlap backward "
            "(DDP bucket_cap_mb, no find_unused_parameters) or shard with FSDP so "
            "reduce-scatter overlaps compute."
        )
        evidence += (ev("comm_advice", "advice", advice),)
    value = share(exposed, wall)
    return Fact(value, evidence, impact=value if finite(value) else 0.0)


@fact("rank_imbalance", provides=("ranks", "busiest_ms", "idlest_ms"))
def rank_imbalance(ctx: TriageContext) -> Fact | Unavailable:
    """(max − min) / max of the ranks' busy time: the faster ranks wait for the slowest
    at every collective."""
    tl = _timeline_frames(ctx)
    if tl is None:
        return Unavailable("the run has no device or collective spans")
    b = tl.breakdown
    busy = (b["wall_ns"] - b["idle_ns"]).groupby(b["rank_key"]).sum()
    if len(busy) < 2:
        return Unavailable("the run has one rank")
    value = float((busy.max() - busy.min()) / busy.max()) if busy.max() > 0 else 0.0
    evidence = (
        ev("ranks", "ranks", len(busy)),
        ev("busiest_ms", "busiest rank", busy.max() / 1e6, "ms"),
        ev("idlest_ms", "least busy rank", busy.min() / 1e6, "ms"),
    )
    return Fact(value, evidence, impact=value)


@fact("ranks", provides=())
def ranks(ctx: TriageContext) -> Fact:
    """How many ranks (GPUs of one job) the run recorded."""
    values = set()
    for name in ("steps", "spans"):
        col = ctx.run.table(name)["rank"].dropna()
        values |= set(col.unique().tolist())
    return Fact(len(values))


# -- step 5 --------------------------------------------------------------------------------
@fact(
    "prefix_reuse_missed",
    provides=(
        "groups",
        "grouped",
        "prefix_len",
        "shareable",
        "hits",
        "hit_pct",
        "prefix_cache",
        "missed_pct",
        "cost_ms",
        "source",
        "block",
        "cache_advice",
    ),
)
def prefix_reuse_missed(ctx: TriageContext) -> Fact | Unavailable:
    """Share of all prompt tokens that were a prefix already computed for an earlier
    request of the same prefix group, computed again instead of served from the prefix
    cache (an upper bound: every request after the first of its group could hit)."""
    req = ctx.run.requests
    grouped = req[req["prefix_group"].notna().to_numpy()] if len(req) else req
    if not len(grouped):
        return Unavailable("no request carries a prefix group")
    spec = (ctx.run_options.get("workload") or {}).get("shared_prefix") or {}
    length = spec.get("length") if isinstance(spec, dict) else None
    if not length:
        return Unavailable("the run does not record its shared-prefix length")
    evidence_of = _prefix_evidence(ctx, grouped)
    if isinstance(evidence_of, Unavailable):
        return evidence_of
    hits, block, setting, source, advice = evidence_of
    prompt = grouped["prompt_tokens"].to_numpy("float64", na_value=np.nan)
    reusable = np.minimum(length // block * block, np.nan_to_num(prompt) - 1).clip(min=0)
    first = ~grouped["prefix_group"].duplicated().to_numpy()  # the first of each group computes it
    shareable = float(reusable[~first].sum())
    total = float(np.nansum(req["prompt_tokens"].to_numpy("float64", na_value=np.nan)))
    missed = max(0.0, shareable - hits)
    value = share(missed, total)
    cache = ctx.get("cache")
    per_token = cache.cost_per_prefill_token_s if cache is not None else float("nan")
    if cache is None:  # a server's run: its own prefill time per prompt token it computed
        per_token = server_prefill_per_token(ctx)
    evidence = (
        ev("source", "evidence from", source),
        ev("groups", "prefix groups", int(grouped["prefix_group"].nunique())),
        ev("grouped", "requests in a group", len(grouped)),
        ev("prefix_len", "shared prefix", int(length), "tokens"),
        ev("block", "tokens per cache block", int(block)),
        ev("shareable", "prompt tokens that could hit", int(shareable), "tokens"),
        ev("hits", "prompt tokens that hit", int(hits), "tokens"),
        ev("hit_pct", "hit / could hit", share(hits, shareable), "%"),
        ev("prefix_cache", "prefix caching", {True: "on", False: "off"}.get(setting, "unknown")),
        ev("missed_pct", "prompt tokens recomputed needlessly", value, "%"),
        ev("cost_ms", "estimated prefill time lost", ms(missed * per_token), "ms"),
        ev("cache_advice", "advice", advice),
    )
    cached = grouped["cached_tokens"]
    zero = grouped[(cached.fillna(0).to_numpy() == 0) & cached.notna().to_numpy()]
    ids = (
        IdList(
            "request", "grouped requests with no hit", tuple(zero["request_id"].astype(str).head(5))
        ),
    )
    action = None
    if setting is False and not driven_server(ctx.config):
        action = run_action(
            "ttft.p50",
            Setting("engine.prefix_cache", False, True),
            expect=f"about {ms(missed * per_token):.0f} ms less prefill in all",
        )
    elif setting is False:  # a launched server, relaunched with its flag (verify-advice)
        action = server_action(ServerSettings.of(ctx.config), "ttft.p50",
                               "enable_prefix_caching", False, True,
                               f"{int(missed):,} prompt tokens served from the cache")  # fmt: skip
    return Fact(
        value if finite(value) else 0.0,
        evidence,
        ids,
        impact=value if finite(value) else 0.0,
        action=action,
    )


def _prefix_evidence(ctx: TriageContext, grouped):
    """(prompt tokens that hit, block size, prefix caching on?, source, advice) from the
    engine's record (cached tokens per request) or else the server's own counters; never
    from an empty column."""
    cached = grouped["cached_tokens"]
    events = ctx.run.request_events
    if cached.notna().any() or (events["side"] == "engine").to_numpy().any():
        hits = float(np.nansum(cached.to_numpy("float64", na_value=np.nan)))
        block = ctx.engine_setting("block_size", "cache", "block_size") or 1
        setting = ctx.engine_setting("prefix_cache", "cache", "enable_prefix_caching")
        advice = (
            "Turn on prefix caching (--prefix-cache); if it is on, give the pool room to keep "
            "the hot prefixes. A cache-aware policy (--policy prefix) raises reuse; watch "
            "fairness for cold prefixes."
        )
        return hits, block, setting, "engine record (cached tokens per request)", advice
    server = server_prefix_hits(ctx)
    if server is None:
        return Unavailable("neither the engine's record nor the server's metrics say how many "
                           "prompt tokens hit the prefix cache")  # fmt: skip
    hits, _queried, source = server
    settings = ServerSettings.of(ctx.config)
    block = settings.get("block_size") or 1
    setting = settings.get("enable_prefix_caching")
    knob = settings.knob("enable_prefix_caching") or "prefix caching"
    if setting is False:
        advice = f"Turn on prefix caching: {knob} (the launch turned it off)."
    else:
        state = "on" if setting else "in an unknown state"
        advice = (
            f"Prefix caching is {state}: keep shared prefixes at least one block ({block} "
            "tokens) long and byte-identical at the start of the prompt, and give the KV "
            "cache room to keep the hot prefixes."
        )
    return hits, block, setting, source, advice


@fact("cache_hits", provides=("hit_pct", "device_tokens", "device_saved_ms", "host_tokens",
                              "host_saved_ms", "swap_tokens", "swap_saved_ms", "saved_ms",
                              "saved_pct"))  # fmt: skip
def cache_hits(ctx: TriageContext) -> Fact | Unavailable:
    """Share of prompt tokens served from the prefix cache at admission, with the tier
    they came from and the compute each tier saved (facts_offload.tier_evidence)."""
    from .facts_offload import tier_evidence

    c = ctx.get("cache")
    if c is None:
        return ctx.missing("cache")
    evidence = tier_evidence(ctx, c)
    return Fact(c.hit_rate if finite(c.hit_rate) else 0.0, evidence)
