"""A recorded run with the host tier (`perfdiag run --kv-offload-mb`): the counters land in
the run's table at the admitting step's start, their per-admission sums match the
`scheduled` events' num_cached_tokens, step 5's cache-hits names the host tier's tokens;
the same run without the tier records none of them and reads as before."""

from __future__ import annotations

import numpy as np
import pytest

from perfdiag import load_run
from perfdiag.analyzers import kv_offload as ko
from perfdiag.playbooks.facts import TriageContext, evaluate_fact
from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, PrefixSpec, WorkloadSpec

WORKLOAD = WorkloadSpec(
    requests=40,
    warmup=2,
    seed=5,
    arrival=ArrivalSpec(mode="closed", concurrency=2),
    prompt_len=LengthSpec.parse("uniform:4:12"),
    output_len=LengthSpec.parse("uniform:2:4"),
    shared_prefix=PrefixSpec(groups=8, length=40, skew=0.0),  # 80 hot blocks, 24 on device
)


def record(tmp_path, mb: float):
    engine = EngineOptions(preset="tiny", kv_blocks=24, block_size=4, kv_offload_mb=mb)
    path = tmp_path / f"mb{mb:g}"
    record_run(RunOptions(engine, WORKLOAD, ProbeOptions(sample_period_s=0.05)), path,
               command=["pytest"])  # fmt: skip
    return load_run(path)


def test_host_tier_counters_are_recorded_and_agree_with_the_events(tmp_path):
    run = record(tmp_path, 1.0)
    a = ko.admissions(run)
    assert a["kv_hit_host_tokens"].sum() > 0
    e = run.request_events
    sched = e[(e["kind"] == "scheduled").to_numpy() & (e["num_cached_tokens"] > 0).to_numpy()]
    assert len(a) == len(sched)  # one tier split per admission with a hit
    total = (a["kv_hit_device_tokens"] + a["kv_hit_host_tokens"]).sum()
    assert total == sched["num_cached_tokens"].sum()
    starts = set(run.steps["start_ns"].to_numpy(np.int64))
    assert set(a["ts_ns"].astype(np.int64)) <= starts  # at the admitting step's start
    ev = {x.name: x.value for x in evaluate_fact("cache_hits", TriageContext(run), {}).evidence}
    assert ev["host_tokens"] == a["kv_hit_host_tokens"].sum()
    assert run.manifest.config["run_options"]["engine"]["kv_offload_mb"] == 1.0


@pytest.mark.parametrize("mb", [0.0])
def test_without_the_tier_nothing_is_recorded(tmp_path, mb):
    run = record(tmp_path, mb)
    assert not ko.has_offload(run)
    f = evaluate_fact("offload_thrash", TriageContext(run), {})
    assert "no host tier" in f.reason
    ev = {x.name: x.value for x in evaluate_fact("cache_hits", TriageContext(run), {}).evidence}
    assert ev["host_tokens"] is None and ev["device_tokens"] > 0
