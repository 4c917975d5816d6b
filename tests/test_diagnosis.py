"""The playbooks diagnose broken runs of the reference engine: a fast version of the
diagnosis suite (benchmarks/diagnosis), on variations of its scenarios with other
numbers than the suite uses, so the thresholds are not fitted to one configuration.
Faults are real (configuration, or hooks that spend time); nothing writes events."""

import dataclasses
import time

import pytest
from scenario_module import sc

from perfdiag.engine_ref.hooks import RecordingObserver, RequestEvent, RequestEventKind, StepEvent
from perfdiag.errors import ConfigError
from perfdiag.probes.faults import FaultObserver, FaultOptions
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, PrefixSpec

VARIANTS = {
    # another rate, cap and output length than the suite's client-cap scenarios
    "client-cap": sc.varied(
        sc.by_name("client-cap"),
        seed=11,
        arrival=ArrivalSpec("open", rate=24.0, concurrency=1),
        output_len=LengthSpec.parse("uniform:32:64"),
    ),
    "over-capacity": dataclasses.replace(
        sc.varied(
            sc.by_name("over-capacity"),
            seed=12,
            arrival=ArrivalSpec("open", rate=150.0, process="poisson"),
        ),
        engine={"max_seqs": 3},
    ),
    "prefix-cache-off": sc.varied(
        sc.by_name("prefix-cache-off"),
        seed=13,
        arrival=ArrivalSpec("closed", concurrency=6),
        shared_prefix=PrefixSpec(3, 160, 0.8),
    ),
    "host-bound": dataclasses.replace(
        sc.by_name("host-bound"),
        # 2.5 ms sat at the host-share threshold (0.39 against 0.40) and flipped between
        # runs: a variant must not sit on the rule's boundary
        faults=FaultOptions(step_gap_ms=3.5),
        workload={"arrival": ArrivalSpec("closed", concurrency=6)},
    ),
    "slow-input": dataclasses.replace(
        sc.by_name("slow-input"),
        faults=FaultOptions(input_delay_ms=25.0),
        workload={"arrival": ArrivalSpec("open", rate=8.0)},
    ),
    "kv-too-small": dataclasses.replace(
        sc.varied(
            sc.by_name("kv-too-small"), seed=14, output_len=LengthSpec.parse("uniform:80:128")
        ),
        engine={"kv_blocks": 24},
    ),
    "healthy": sc.varied(sc.by_name("healthy"), seed=15, arrival=ArrivalSpec("open", rate=10.0)),
    # a cap of 3 under 9 clients with other lengths
    "seq-cap": dataclasses.replace(
        sc.varied(
            sc.by_name("seq-cap"),
            seed=16,
            arrival=ArrivalSpec("closed", concurrency=9),
            prompt_len=LengthSpec.parse("uniform:32:128"),
        ),
        engine={"max_seqs": 3},
    ),
    "cold-starvation": dataclasses.replace(
        sc.varied(
            sc.by_name("cold-starvation"),
            seed=17,
            shared_prefix=PrefixSpec(6, 160, 1.3),
            arrival=ArrivalSpec("closed", concurrency=10),
        ),
        engine=sc.by_name("cold-starvation").engine | {"max_seqs": 2},
    ),
    # The mean rate as a share of the capacity a closed loop measured just before on this
    # machine: a fixed rate made the load light on a fast host and the bursts harmless.
    "bursty": dataclasses.replace(
        sc.varied(
            sc.by_name("bursty"),
            seed=18,
            arrival=ArrivalSpec("open", rate=7.0, process="gamma", burstiness=0.2),
        ),
        engine={"max_seqs": 3},
        rate_of=("bursty-capacity", 0.7),
    ),
    # a shorter, more frequent pause than the suite's, closed loop, another seed
    "tp-slow-rank": dataclasses.replace(
        sc.varied(sc.by_name("tp-slow-rank"), seed=19, arrival=ArrivalSpec("closed", 3)),
        faults=FaultOptions(slow_rank=1, slow_rank_stall_ms=6.0, slow_rank_period_ms=15.0),
    ),
    # other hot experts (1 and 2, still rank 0's), another bias, prompts and seed
    "moe-hot-expert": dataclasses.replace(
        sc.varied(
            sc.by_name("moe-hot-expert"), seed=23, prompt_len=LengthSpec.parse("uniform:640:1280")
        ),
        engine=sc.by_name("moe-hot-expert").engine | {"expert_bias": "1:2.5,2:2.5"},
    ),
}
PREREQUISITES = {
    "bursty-capacity": sc.Scenario(
        "bursty-capacity", "the bursty variant's engine in a closed loop: its capacity", "",
        engine={"max_seqs": 3},
        # 48 requests: the variant runs at 0.7 of this capacity, and a capacity from 24
        # scattered enough for bursts to read as overload once in a fresh-clone CI run
        workload=dict(requests=48, arrival=ArrivalSpec("closed", concurrency=3)),
    ),
}  # fmt: skip
# The causes the suite added with their own checks: never critical on the others.
OWN_CHECKS = ("chunk-too-small", "cold-starvation", "bursty-load")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_top_finding_names_the_cause(tmp_path, name):
    scenario = VARIANTS[name]
    if scenario.rate_of is not None:
        PREREQUISITES[scenario.rate_of[0]].record(tmp_path / scenario.rate_of[0])
    triage = scenario.diagnose(scenario.record(tmp_path / name, requests=32))
    top = triage.top
    summary = [(f.check, f.severity, f.consequence_of) for f in triage.findings]
    assert scenario.verdict(triage), f"{name}: top {top and top.check}; findings {summary}"
    if scenario.expected != sc.HEALTHY:
        assert top.severity in ("warning", "critical") and top.evidence
        assert top.recommendations
    for check in set(OWN_CHECKS) - {scenario.expected}:
        # (a slicing that costs a few prompts a step may be a warning beside another
        # fault: it is real; it must not be critical, or what is named first)
        f = triage.by_check(check)
        assert f is None or f.severity != "critical", f"{name}: {check} is critical"


@pytest.mark.parametrize(
    ("name", "engine", "check"),
    [
        ("cold-starvation", {"policy": "fcfs"}, "cold-starvation"),  # the same load, fair order
        ("bursty", {}, "bursty-load"),  # the same mean rate, Poisson arrivals
    ],
)
def test_a_check_is_silent_on_its_fair_control(tmp_path, name, engine, check):
    s = sc.by_name(name)
    arrival = s.workload.get("arrival")
    if check == "bursty-load":
        arrival = ArrivalSpec("open", rate=arrival.rate, process="poisson")
    control = dataclasses.replace(
        sc.varied(s, arrival=arrival), name=f"{name}-control", engine=s.engine | engine
    )
    triage = control.diagnose(control.record(tmp_path / control.name, requests=48))
    f = triage.by_check(check)
    assert f is None or f.severity == "info", f"{check} fired on its control: {f and f.title}"


def test_every_suite_scenario_has_a_varied_twin():
    names = {s.name for s in sc.SCENARIOS}
    twins = {s.variant_of for s in sc.SCENARIOS if s.variant_of}
    originals = {s.name for s in sc.SCENARIOS if not s.variant_of}
    assert originals <= twins <= names
    # the causes, the healthy case and the profiler accounted for in the gate
    assert len({s.expected for s in sc.SCENARIOS}) >= 15
    # every cause in at least two configurations
    for cause in {s.expected for s in sc.SCENARIOS}:
        assert sum(s.expected == cause for s in sc.SCENARIOS) >= 2, cause
    # the README scenarios come with two seeds each
    readme = [s.name.rsplit("-s", 1) for s in sc.README_SCENARIOS]
    assert all(n for n, _ in readme) and {k for _, k in readme} == {"1", "2"}


def test_faults_spend_real_time_at_their_hook_and_forward_everything():
    inner = RecordingObserver()
    inner.client_event = lambda *a: a  # the recorder is also the client's sink
    obs = FaultObserver(inner, FaultOptions(input_delay_ms=20.0, step_gap_ms=10.0))
    t0 = time.perf_counter()
    obs.on_request(RequestEvent("r", RequestEventKind.ARRIVED, 0, -1, 5))
    t1 = time.perf_counter()
    obs.on_request(RequestEvent("r", RequestEventKind.TOKENIZED, 0, -1, 5))
    t2 = time.perf_counter()
    obs.on_step(StepEvent(0, 0, 1, *([0] * 13)))
    t3 = time.perf_counter()
    assert t1 - t0 >= 0.019 and t2 - t1 < 0.005 and t3 - t2 >= 0.009
    assert len(inner.requests) == 2 and len(inner.steps) == 1
    assert obs.client_event(1, 2) == (1, 2)
    assert FaultOptions().wrap(inner) is inner  # no fault: the observer itself
    with pytest.raises(ConfigError, match="step_gap_ms must be >= 0"):
        FaultOptions(step_gap_ms=-1)


def test_a_closed_loops_queue_beside_a_neighbour_is_named_as_the_caps(tmp_path):
    """Issue 35's case: a sequence cap of 2 under 8 clients beside a process burning a
    core. The closed loop's queue is the cap's whatever the neighbour takes: it is named
    first, as no consequence of host contention, its advice raises --max-seqs."""
    s = sc.by_name("seq-cap-neighbour")
    triage = s.diagnose(s.record(tmp_path / s.name))
    top = triage.top
    assert top.check == "queue-dominates-ttft" and top.consequence_of is None, [
        (f.check, f.severity, f.consequence_of) for f in triage.findings
    ]
    assert top.in_part_from is None
    assert top.action is not None and top.action.settings[0].option == "engine.max_seqs"


@pytest.mark.parametrize("seed", [1, 2])
def test_a_healthy_default_closed_loop_warns_only_where_its_advice_would_gain(tmp_path, seed):
    """The README's default model in a closed loop of 4 (issue 35: every such run carried
    an itl-prefill-interference warning whose advice promised ~8 %). A warning about
    prefill interference must come with advice predicted to gain ≥ 10 % of its metric."""
    s = sc.by_name(f"readme-closed4-s{seed}")
    triage = s.diagnose(s.record(tmp_path / s.name, requests=32))
    f = triage.by_check("itl-prefill-interference")
    if f is not None and f.severity != "info":
        gain = next(e.value for e in f.evidence if e.name == "predicted_gain")
        assert -gain >= 0.1, f.title
    assert not [x for x in triage.findings if x.severity == "critical"]
