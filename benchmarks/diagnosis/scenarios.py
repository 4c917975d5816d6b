"""The diagnosis scenarios: the reference engine under deliberately broken conditions,
each with the triage check its top finding must be.

Every fault is real: a configuration that breaks the named part (a client cap, a rate
above capacity, chunked prefill off, a KV pool too small, prefix caching off), an
engine hook that really spends time at the named point (probes/faults.py), processes
burning the same cores (faults.burning) or a profiler window. Nothing writes an event.
Each scenario has a variant with other numbers, another workload shape or another
mechanism, so the playbook thresholds are not fitted to one configuration.

The "README" scenarios start from what a new user runs — `perfdiag run`'s defaults (the
`small` preset, the `chat` workload, every probe on) — and change one thing each, with
two seeds: a closed loop, an open loop at 30 % of the capacity the closed loop measured,
a CPU-burning neighbour, a profiler window.

This module imports only perfdiag, so tests can load it by path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from perfdiag import load_run
from perfdiag.analyzers.findings import Triage
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext
from perfdiag.probes.faults import FaultOptions, burning
from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, PrefixSpec, WorkloadSpec
from perfdiag.probes.workload_library import DEFAULT_WORKLOAD, load_workload
from perfdiag.traces.environment import machine_cores

HEALTHY = "none critical"  # what a healthy run must show
PROBES_ACCOUNTED = "gate names the probes"  # the gate names them; no engine finding blames them
# Findings a probe stall would feed if it were blamed on the engine.
PROBE_BLAMABLE = ("queue-dominates-ttft", "itl-delivery-stalls", "itl-host-gaps", "ttft-host-gaps",
                  "ttft-return", "over-capacity", "host-bound", "step-inflation")  # fmt: skip

_ENGINE = dict(preset="tiny", kv_cache_mb=8.0, max_seqs=16, chunk_size=64)
_WORKLOAD = dict(
    requests=48,
    warmup=4,
    seed=1,
    arrival=ArrivalSpec(mode="open", rate=15.0, process="poisson"),
    prompt_len=LengthSpec.parse("uniform:16:96"),
    output_len=LengthSpec.parse("uniform:8:32"),
)

_DP = dict(preset="small", kv_cache_mb=16.0, max_seqs=4, dp=2)
_DP_WORKLOAD = dict(requests=32, warmup=4)


def _open(rate: float, cap: int | None = None, process: str = "poisson", **kw) -> ArrivalSpec:
    return ArrivalSpec(mode="open", rate=rate, concurrency=cap, process=process, **kw)


def _closed(n: int) -> ArrivalSpec:
    return ArrivalSpec(mode="closed", concurrency=n)


def _len(text: str) -> LengthSpec:
    return LengthSpec.parse(text)


@dataclass(frozen=True)
class Scenario:
    name: str
    cause: str  # the broken condition, in words
    expected: str  # the check id the top finding must be (HEALTHY: nothing critical)
    engine: dict = field(default_factory=dict)  # EngineOptions overrides
    workload: dict = field(default_factory=dict)  # WorkloadSpec overrides
    faults: FaultOptions | None = None
    variant_of: str | None = None
    readme: bool = False  # start from `perfdiag run`'s defaults instead of the suite's
    probes: dict = field(default_factory=dict)  # ProbeOptions overrides
    neighbours: float = 0.0  # CPU-burning processes per core while it records
    # (scenario, share): an open loop at `share` of the completion rate that scenario's run
    # measured (its run must be recorded first, in the same folder)
    rate_of: tuple[str, float] | None = None

    def options(self, requests: int | None = None, rate: float | None = None) -> RunOptions:
        if self.readme:
            spec = load_workload(DEFAULT_WORKLOAD)
            base = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
            del base["name"]
            engine, probes = EngineOptions(**self.engine), ProbeOptions(**self.probes)
        else:
            base = _WORKLOAD
            engine = EngineOptions(**(_ENGINE | self.engine))
            probes = ProbeOptions(**({"device_sampling": False} | self.probes))
        work = base | self.workload
        if rate is not None:  # an open loop keeps its own process (bursts stay bursts)
            own = work.get("arrival")
            arrival = (dataclasses.replace(own, rate=rate) if own is not None and own.mode == "open"
                       else ArrivalSpec(mode="open", rate=rate, process="poisson"))  # fmt: skip
            work |= {"arrival": arrival}
        if requests is not None:
            work |= {"requests": requests, "warmup": min(work["warmup"], requests // 8)}
        return RunOptions(engine, WorkloadSpec(name=self.name, **work), probes)

    def record(self, out_dir: Path, requests: int | None = None) -> Path:
        rate = None
        if self.rate_of is not None:
            rate = self.rate_of[1] * completion_rate(out_dir.parent / self.rate_of[0])
        with burning(self.neighbours * machine_cores()):
            record_run(
                self.options(requests, rate),
                out_dir,
                command=["benchmarks.diagnosis", self.name],
                faults=self.faults,
            )
        return out_dir

    def diagnose(self, run_dir: Path) -> Triage:
        return run_triage(TriageContext(load_run(run_dir)))

    def verdict(self, triage: Triage) -> bool:
        if self.expected == HEALTHY:
            return not any(f.severity == "critical" for f in triage.findings)
        if self.expected == PROBES_ACCOUNTED:
            gate = triage.by_check("probe-stalls")
            # A finding that follows from the stall is attributed to it, not to the engine.
            engine = [f for f in triage.causes if f.consequence_of != "probe-stalls"]
            blamed = [f for f in engine if f.check in PROBE_BLAMABLE]
            critical = [f for f in engine if f.severity == "critical"]
            return gate is not None and gate.severity != "info" and not blamed and not critical
        return triage.top is not None and triage.top.check == self.expected


def completion_rate(run_dir: Path) -> float:
    """Requests completed per second in a recorded run's steady window."""
    from perfdiag.analyzers.serving import analyze_serving

    m = analyze_serving(load_run(run_dir)).metrics
    return float(m.throughput.requests_per_s)


# Mixture of experts: small-moe (8 experts, top-2, experts as wide as the shared expert)
# over 2 expert-parallel ranks (--tp 2: E/2 contiguous experts per rank). One request at
# a time with long prompts: steps are the request's own prefill (no other request's work
# to interfere), so the experts' GEMMs weigh in each step next to attention and the
# combines.
_MOE = dict(preset="small-moe", tp=2, kv_cache_mb=64.0, max_seqs=16, chunk_size=2048)
_MOE_WORKLOAD = dict(
    requests=32,
    warmup=4,
    arrival=_closed(1),
    prompt_len=_len("uniform:768:1536"),
    output_len=_len("uniform:1:3"),
)

# Speculative decoding's scenarios: a closed loop (tokens/s is the engine's, so a K
# advice can be verified on it), short prompts (decode steps, where drafts are verified)
# and outputs long enough to draft from.
_SPEC_WORKLOAD = dict(arrival=_closed(4), prompt_len=_len("uniform:8:32"),
                      output_len=_len("uniform:32:64"))  # fmt: skip

# The host tier's scenarios: many short shared prefixes (their hot set is larger than the
# device pool), 16-48 tokens of each request's own (enough prefill for the step cost model
# to price a prompt token), short outputs, so admissions and their restores dominate.
_OFFLOAD_WORKLOAD = dict(shared_prefix=PrefixSpec(16, 24, 0.5), prompt_len=_len("uniform:16:48"),
                         output_len=_len("uniform:2:6"))  # fmt: skip

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy", "nothing: load within capacity, defaults", HEALTHY),
    Scenario(
        "healthy-closed",
        "nothing: closed loop, shared prefixes, cache on",
        HEALTHY,
        workload=dict(arrival=_closed(4), shared_prefix=PrefixSpec(4, 64, 1.0)),
        variant_of="healthy",
    ),
    Scenario(
        "client-cap",
        "client concurrency cap below what the target rate needs",
        "client-back-pressure",
        workload=dict(arrival=_open(30.0, cap=1), output_len=_len("uniform:48:80")),
    ),
    Scenario(
        "client-cap-b",
        "cap of 2 under a steady rate, long outputs",
        "client-back-pressure",
        workload=dict(
            arrival=_open(16.0, cap=2, process="constant"),
            seed=5,
            output_len=_len("uniform:96:160"),
        ),
        variant_of="client-cap",
    ),
    Scenario(
        "over-capacity",
        "arrival rate above capacity",
        "over-capacity",
        engine=dict(max_seqs=4),
        workload=dict(requests=64, arrival=_open(120.0), output_len=_len("uniform:24:48")),
    ),
    Scenario(
        "over-capacity-b",
        "bursty arrivals above capacity, longer prompts",
        "over-capacity",
        engine=dict(max_seqs=2),
        workload=dict(
            requests=64,
            seed=9,
            arrival=_open(70.0, process="gamma", burstiness=0.5),
            prompt_len=_len("uniform:64:160"),
            output_len=_len("uniform:16:40"),
        ),
        variant_of="over-capacity",
    ),
    Scenario(
        "long-prompts-no-chunking",
        "long prompts without chunked prefill beside decodes",
        "itl-prefill-interference",
        # (max_seqs 64: with the suite's 16 a slow machine's runs also queue at the
        # cap — a second, real bottleneck that queue-dominates-ttft rightly names)
        engine=dict(preset="small", chunk_size=None, kv_cache_mb=64.0, max_seqs=64),
        workload=dict(
            requests=24,
            warmup=2,
            arrival=_open(2.0),
            prompt_len=_len("lognormal:48:1.3:16:1500"),
            output_len=_len("uniform:16:32"),
        ),
    ),
    Scenario(
        "long-prompts-huge-chunks",
        "chunking on, but chunks as long as the prompts",
        "itl-prefill-interference",
        engine=dict(preset="small", chunk_size=2048, kv_cache_mb=64.0, max_seqs=64),
        workload=dict(
            requests=24,
            warmup=2,
            seed=3,
            arrival=_open(3.0, process="constant"),
            prompt_len=_len("lognormal:40:1.5:16:1800"),
            output_len=_len("uniform:32:64"),
        ),
        variant_of="long-prompts-no-chunking",
    ),
    Scenario(
        "kv-too-small",
        "KV pool too small: preemption storm",
        "preemption-storm",
        engine=dict(kv_blocks=20),
        workload=dict(
            arrival=_open(30.0), prompt_len=_len("uniform:16:48"), output_len=_len("uniform:96:160")
        ),
    ),
    Scenario(
        "kv-too-small-swap",
        "small KV pool, swap preemption, closed loop",
        "preemption-storm",
        engine=dict(kv_blocks=28, preemption="swap"),
        workload=dict(
            arrival=_closed(12),
            seed=4,
            prompt_len=_len("uniform:24:64"),
            output_len=_len("uniform:128:192"),
        ),
        variant_of="kv-too-small",
    ),
    Scenario(
        "slow-input",
        "slow input processing (15 ms per request before tokenising)",
        "slow-input",
        faults=FaultOptions(input_delay_ms=15.0),
    ),
    Scenario(
        "slow-input-cpu",
        "CPU-bound input processing proportional to the prompt",
        "slow-input",
        faults=FaultOptions(input_delay_per_token_us=150.0, busy=True),
        workload=dict(arrival=_closed(3), seed=6, prompt_len=_len("uniform:48:128")),
        variant_of="slow-input",
    ),
    Scenario(
        "host-bound",
        "host work between forward passes (3 ms after each step)",
        "host-bound",
        faults=FaultOptions(step_gap_ms=3.0),
    ),
    Scenario(
        "host-bound-scheduler",
        # (2 ms against a ~5.5 ms forward measured a host share of 0.35-0.43: on the
        # rule's 0.40 boundary, flipping between seeds; 3 ms is host-bound by any reading)
        "a slow CPU-bound scheduler (3 ms spin in every step)",
        "host-bound",
        faults=FaultOptions(schedule_delay_ms=3.0, busy=True),
        workload=dict(arrival=_closed(8), seed=8),
        variant_of="host-bound",
    ),
    Scenario(
        "chunk-too-small",
        "long prompts sliced into 16-token chunks",
        "chunk-too-small",
        engine=dict(chunk_size=16),
        workload=dict(
            requests=32,
            arrival=_open(4.0),
            prompt_len=_len("uniform:192:384"),
            output_len=_len("uniform:8:24"),
        ),
    ),
    Scenario(
        "token-budget-too-small",
        "a token budget of 48 per step under long prompts, closed loop",
        "chunk-too-small",
        engine=dict(max_batched_tokens=48, chunk_size=512),
        workload=dict(
            requests=32,
            seed=7,
            arrival=_closed(3),
            prompt_len=_len("lognormal:224:0.3:96:480"),
            output_len=_len("uniform:8:16"),
        ),
        variant_of="chunk-too-small",
    ),
    Scenario(
        "seq-cap",
        "a sequence cap of 2 under 8 clients, KV nearly empty",
        "queue-dominates-ttft",
        engine=dict(max_seqs=2),
        workload=dict(arrival=_closed(8), output_len=_len("uniform:16:40")),
    ),
    Scenario(
        "seq-cap-neighbour",
        "the seq-cap fault beside a process burning one core (issue 35: the closed loop's "
        "queue is the cap's, not the neighbour's)",
        "queue-dominates-ttft",
        engine=dict(max_seqs=2),
        workload=dict(arrival=_closed(8), output_len=_len("uniform:16:40"), seed=3),
        neighbours=0.5,
        variant_of="seq-cap",
    ),
    Scenario(
        "seq-cap-b",
        "a cap of 3 under 10 clients, longer prompts, a larger pool",
        "queue-dominates-ttft",
        engine=dict(max_seqs=3, kv_cache_mb=32.0, chunk_size=128),
        workload=dict(
            arrival=_closed(10),
            seed=11,
            prompt_len=_len("uniform:64:192"),
            output_len=_len("uniform:24:48"),
        ),
        variant_of="seq-cap",
    ),
    Scenario(
        "cold-starvation",
        "cache-aware order with no fairness bound: cold prefixes wait behind hot ones",
        "cold-starvation",
        engine=dict(max_seqs=3, policy="prefix", max_wait_ms=None),
        workload=dict(
            requests=64,
            arrival=_closed(12),
            shared_prefix=PrefixSpec(8, 128, 1.5),
            prompt_len=_len("uniform:8:32"),
            output_len=_len("uniform:16:32"),
        ),
    ),
    Scenario(
        "cold-starvation-b",
        "the same policy, many groups, short outputs, a larger cap",
        "cold-starvation",
        engine=dict(max_seqs=4, policy="prefix", max_wait_ms=None, chunk_size=256),
        workload=dict(
            requests=64,
            seed=12,
            arrival=_closed(16),
            shared_prefix=PrefixSpec(12, 96, 1.2),
            prompt_len=_len("uniform:16:64"),
            output_len=_len("uniform:8:16"),
        ),
        variant_of="cold-starvation",
    ),
    Scenario(
        "bursty",
        "bursty arrivals (gamma shape 0.15) at a mean rate the engine sustains",
        "bursty-load",
        engine=dict(max_seqs=4),
        workload=dict(requests=64, arrival=_open(10.0, process="gamma", burstiness=0.15)),
    ),
    Scenario(
        "bursty-b",
        "bursts of another shape, longer outputs, another cap",
        "bursty-load",
        engine=dict(max_seqs=2),
        workload=dict(
            requests=64,
            seed=13,
            # (6 req/s measured a capacity of 5.3-5.8 at this cap: at capacity, not
            # under it; 4 is about 70 %)
            arrival=_open(4.0, process="gamma", burstiness=0.25),
            output_len=_len("uniform:24:48"),
        ),
        variant_of="bursty",
    ),
    # Data-parallel replicas (--dp 2, threads of one process, one core each here) behind
    # a load-blind weighted router: one replica gets most of the work and queues while
    # the other has room. `small`, not `tiny`: its forward outweighs the host work the
    # replicas' threads take turns at (tiny's replicas are host-bound by design).
    Scenario(
        "dp-router-imbalance",
        "2 replicas, a weighted:3,1 router sends three requests in four to replica 0",
        "dp-imbalance",
        engine=dict(_DP, router="weighted:3,1"),
        # replica 0 gets 3.4 req/s, about what one replica sustains while other jobs share
        # the cores; both together sustain ~8 on a quiet machine, so the advice's re-run
        # (least-loaded) has room even on a busy one
        workload=dict(_DP_WORKLOAD, requests=48, arrival=_open(4.5)),
    ),
    Scenario(
        "dp-router-imbalance-b",
        "the other replica overloaded (weighted:1,4), closed loop of 8, longer outputs",
        "dp-imbalance",
        engine=dict(_DP, router="weighted:1,4", max_seqs=3),
        workload=dict(_DP_WORKLOAD, seed=14, arrival=_closed(8), output_len=_len("uniform:16:40")),
        variant_of="dp-router-imbalance",
    ),
    Scenario(
        "dp-healthy",
        "nothing: 2 replicas behind a least-loaded router, load within capacity",
        HEALTHY,
        # batches of up to 16 and a third of what two replicas sustain at 4 (~8 req/s):
        # room to spare even on a machine busy with other jobs
        engine=dict(_DP, router="least-loaded", max_seqs=16),
        workload=dict(_DP_WORKLOAD, arrival=_open(3.0)),
    ),
    Scenario(
        "dp-healthy-b",
        "nothing: 2 replicas, round-robin, a closed loop of 4, shared prefixes",
        HEALTHY,
        engine=dict(_DP, router="round-robin", max_seqs=8),
        workload=dict(
            _DP_WORKLOAD, seed=15, arrival=_closed(4), shared_prefix=PrefixSpec(4, 32, 1.0)
        ),
        variant_of="dp-healthy",
    ),
    Scenario(
        "prefix-cache-off",
        "shared-prefix workload with prefix caching off",
        "prefix-not-reused",
        engine=dict(prefix_cache=False),
        workload=dict(
            arrival=_closed(8),
            shared_prefix=PrefixSpec(4, 256, 1.0),
            prompt_len=_len("uniform:16:48"),
            output_len=_len("16"),
        ),
    ),
    Scenario(
        "prefix-cache-off-b",
        "many cold prefixes, open loop, caching off",
        "prefix-not-reused",
        engine=dict(prefix_cache=False),
        workload=dict(
            arrival=_open(20.0),
            seed=2,
            shared_prefix=PrefixSpec(8, 192, 0.5),
            prompt_len=_len("uniform:8:64"),
            output_len=_len("uniform:8:24"),
        ),
        variant_of="prefix-cache-off",
    ),
    # Tensor parallelism with one slow rank, slowed from outside its process: a neighbour
    # spinning on the core it is pinned to, or SIGSTOP pauses. The sampler stays on (as in
    # `perfdiag run`), so the host checks can tell other processes from the ranks' own.
    Scenario(
        "tp-slow-rank",
        "tensor parallel 2, rank 1 shares its core with a CPU-burning process",
        "collective-wait",
        engine=dict(tp=2),
        workload=dict(arrival=_closed(4)),
        faults=FaultOptions(slow_rank=1, slow_rank_neighbours=1),
        probes=dict(device_sampling=True),
    ),
    Scenario(
        "tp-slow-rank-b",
        "tensor parallel 2, rank 1 stopped 8 ms of every 20, open loop, longer prompts",
        "collective-wait",
        engine=dict(tp=2, chunk_size=128),
        workload=dict(
            arrival=_open(10.0),
            seed=2,
            prompt_len=_len("uniform:32:160"),
            output_len=_len("uniform:8:24"),
        ),
        faults=FaultOptions(slow_rank=1, slow_rank_stall_ms=8.0, slow_rank_period_ms=20.0),
        probes=dict(device_sampling=True),
        variant_of="tp-slow-rank",
    ),
    # Skewed expert routing: a bias added to chosen experts' router logits (a real change
    # of routing, --expert-bias), so the rank holding them does the MoE layers' expert
    # work while the other waits for it at every layer's combine.
    Scenario(
        "moe-hot-expert",
        "experts 2 and 3 (both on rank 0 of 2) take nearly every token: router bias +3",
        "expert-imbalance",
        engine=dict(_MOE, expert_bias="2:3,3:3"),
        workload=_MOE_WORKLOAD,
    ),
    Scenario(
        "moe-hot-expert-b",
        "experts 5-7 (rank 1) biased +2.5, shorter prompts in 512-token chunks, 2-4 outputs",
        "expert-imbalance",
        engine=dict(_MOE, expert_bias="5:2.5,6:2.5,7:2.5", chunk_size=512),
        workload=dict(
            _MOE_WORKLOAD,
            seed=3,
            prompt_len=_len("uniform:384:768"),
            output_len=_len("uniform:2:4"),
        ),
        variant_of="moe-hot-expert",
    ),
    Scenario(
        "moe-healthy",
        "nothing: the same MoE over 2 expert-parallel ranks, router as initialised, light load",
        HEALTHY,
        engine=dict(_MOE, chunk_size=64),
        workload=dict(
            requests=32,
            warmup=4,
            arrival=_open(1.0),
            prompt_len=_len("uniform:32:128"),
            output_len=_len("uniform:8:24"),
        ),
        variant_of="healthy",  # the healthy baseline on a MoE model over 2 ranks
    ),
    # Speculative decoding (issue 38). A proposer made slow for real (the draft_delay_ms
    # fault spends its time inside every propose call, the draft phase): the drafts cost
    # more than the tokens they gain. Closed loops, so tokens/s measures the engine.
    Scenario(
        "spec-slow-draft",
        "the n-gram proposer spins 5 ms a step more (a slow draft), K = 4",
        "spec-no-speedup",
        engine=dict(speculative="ngram:4"),
        workload=_SPEC_WORKLOAD,
        faults=FaultOptions(draft_delay_ms=5.0, busy=True),
    ),
    Scenario(
        "spec-slow-draft-b",
        "a draft model that is the target itself (every draft accepted) and 3 ms slower",
        "spec-no-speedup",
        engine=dict(speculative="draft:tiny:4"),
        workload=dict(seed=3),
        faults=FaultOptions(draft_delay_ms=3.0, busy=True),
        variant_of="spec-slow-draft",
    ),
    # K far from what the acceptance favours: the tiny preset's random weights accept
    # few n-gram drafts past the first two, so 16 (or 8) drafts per step are mostly
    # verified in vain.
    Scenario(
        "spec-k-far",
        "n-gram speculation at K = 16 where about one draft in ten is accepted",
        "spec-k-mismatch",
        engine=dict(speculative="ngram:16"),
        workload=_SPEC_WORKLOAD,
    ),
    Scenario(
        "spec-k-far-b",
        "n-gram speculation at K = 8, open loop, other prompts",
        "spec-k-mismatch",
        engine=dict(speculative="ngram:8"),
        workload=dict(seed=5),
        variant_of="spec-k-far",
    ),
    # Overlapped scheduling (issue 39): a scheduler spinning 3 ms in every call (the
    # scheduler_work_ms fault wraps the scheduler, so its time moves with it) and overlap
    # off. host-bound names the cost; overlap-off names the knob and what it predicts:
    # on this CPU nothing (the forward holds the thread), on CUDA up to the forward's time.
    Scenario(
        "sched-no-overlap",
        "a CPU-bound scheduler (3 ms spin per call) with overlapped scheduling off",
        "host-bound",
        faults=FaultOptions(scheduler_work_ms=3.0, busy=True),
        workload=dict(arrival=_closed(8), seed=8),
    ),
    Scenario(
        "sched-no-overlap-b",
        "a 2 ms scheduler spin per call, a closed loop of 6, other seed",
        "host-bound",
        faults=FaultOptions(scheduler_work_ms=2.0, busy=True),
        workload=dict(arrival=_closed(6), seed=9),
        variant_of="sched-no-overlap",
    ),
    # The prefix cache's host tier (issue 39): a device pool smaller than the hot prefixes,
    # so they are offloaded and restored, each restore made slow for real (the
    # restore_delay_us fault spends its time inside the copy): short prefixes come back
    # slower than the prefill that would recompute them.
    Scenario(
        "offload-slow-restore",
        "a host tier restoring 24-token prefixes at 5 ms a block of 4 (recompute is cheaper)",
        "offload-restore-slower",
        engine=dict(preset="small", kv_blocks=96, block_size=4, kv_offload_mb=16.0),
        workload=dict(_OFFLOAD_WORKLOAD, shared_prefix=PrefixSpec(24, 24, 0.5)),
        faults=FaultOptions(restore_delay_us=5000.0, busy=True),
    ),
    Scenario(
        "offload-slow-restore-b",
        "32-token prefixes in blocks of 8 restored at 8 ms a block, other seed",
        "offload-restore-slower",
        engine=dict(preset="small", kv_blocks=32, block_size=8, kv_offload_mb=16.0),
        workload=dict(_OFFLOAD_WORKLOAD, seed=3, shared_prefix=PrefixSpec(12, 32, 0.3)),
        faults=FaultOptions(restore_delay_us=8000.0, busy=True),
        variant_of="offload-slow-restore",
    ),
    # Pipeline parallelism (issue 39): two stages and one micro-batch per step, so each
    # stage idles while the other computes: (p − 1)/(m + p − 1) = half the stages' time
    # in fill and drain. Closed loops of long prompts keep several requests per step to
    # split, and steps whose tokens, not a micro-batch's fixed cost, make their time (on
    # short decode steps more micro-batches cost more than they save on this CPU).
    Scenario(
        "pp-few-microbatches",
        "the small preset in 2 pipeline stages over 1 micro-batch per step, long prompts",
        "pp-bubbles",
        engine=dict(preset="small", kv_cache_mb=64.0, pp=2, pp_microbatches=1),
        workload=dict(
            arrival=_closed(4), prompt_len=_len("uniform:256:384"), output_len=_len("2"), seed=9
        ),
    ),
    Scenario(
        "pp-few-microbatches-b",
        "the same over 6 clients, longer prompts, another seed",
        "pp-bubbles",
        engine=dict(preset="small", kv_cache_mb=64.0, pp=2, pp_microbatches=1),
        workload=dict(
            arrival=_closed(6), prompt_len=_len("uniform:320:480"), output_len=_len("2"), seed=3
        ),
        variant_of="pp-few-microbatches",
    ),
)


def _readme_scenarios(seed: int) -> tuple[Scenario, ...]:
    """What a new user runs: the README's default, then one change each."""
    tag = f"-s{seed}"
    closed = dict(arrival=_closed(4), seed=seed)
    return (
        Scenario(f"readme-default{tag}", "nothing: the README's `perfdiag run`", HEALTHY,
                 workload=dict(seed=seed), readme=True),
        Scenario(f"readme-closed4{tag}", "nothing: closed loop at concurrency 4", HEALTHY,
                 workload=closed, readme=True, variant_of=f"readme-default{tag}"),
        Scenario(f"readme-open30{tag}", "nothing: open loop at 30 % of the closed loop's capacity",
                 HEALTHY, workload=dict(seed=seed, requests=24), readme=True,
                 rate_of=(f"readme-closed4{tag}", 0.3), variant_of=f"readme-default{tag}"),
        Scenario(f"readme-neighbour{tag}", "closed loop at 4 beside processes burning every core",
                 "host-contention", workload=closed, readme=True, neighbours=1.0,
                 variant_of=f"readme-closed4{tag}"),
        Scenario(f"readme-profiler{tag}", "the default with a profiler window over steps 10–40",
                 PROBES_ACCOUNTED, workload=dict(seed=seed), readme=True,
                 probes=dict(profile_steps=(10, 40)), variant_of=f"readme-default{tag}"),
    )  # fmt: skip


README_SCENARIOS = _readme_scenarios(1) + _readme_scenarios(2)
SCENARIOS = SCENARIOS + README_SCENARIOS


def by_name(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"no scenario {name!r}; scenarios: {', '.join(s.name for s in SCENARIOS)}")


def varied(scenario: Scenario, **workload) -> Scenario:
    """The scenario with other workload numbers (tests vary what the suite fixed)."""
    return dataclasses.replace(scenario, workload=scenario.workload | workload)
