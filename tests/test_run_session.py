"""`perfdiag run` end to end on the tiny model: the recorded lifecycle is consistent,
cancellation / warm-up / seeds behave, and the run holds every step."""

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from perfdiag import load_run
from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import (
    ArrivalSpec,
    CancelSpec,
    LengthSpec,
    PrefixSpec,
    WorkloadSpec,
)

ENGINE = EngineOptions(preset="tiny", kv_cache_mb=4, max_seqs=8, chunk_size=32)


def _workload(**kw):
    base = dict(
        requests=24,
        warmup=3,
        seed=7,
        arrival=ArrivalSpec(mode="open", rate=80.0, process="poisson"),
        prompt_len=LengthSpec.parse("uniform:8:80"),
        output_len=LengthSpec.parse("uniform:2:12"),
        shared_prefix=PrefixSpec(groups=3, length=32, skew=1.0),
        cancel=CancelSpec(fraction=0.25, after_tokens=2),
    )
    return WorkloadSpec(**(base | kw))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    options = RunOptions(ENGINE, _workload(), ProbeOptions(sample_period_s=0.05))
    path = tmp_path_factory.mktemp("runs") / "a"
    result = record_run(options, path, command=["pytest"])
    return result, load_run(path), options


def _times(events: pd.DataFrame, side: str) -> pd.DataFrame:
    ev = events[events["side"] == side]
    return ev.pivot_table(index="request_id", columns="kind", values="ts_ns",
                          aggfunc="min", observed=True)  # fmt: skip


def test_run_completes_with_every_table(recorded):
    result, run, _ = recorded
    assert result.status == run.status == "complete"
    assert len(run.requests) == 24
    assert run.manifest.extra.get("dropped_records") is None  # every row fitted its schema
    assert len(run.counters) > 0 and set(run.counters["scope"]) >= {"process", "cpu0"}
    config = run.manifest.config
    assert config["run_options"]["workload"]["seed"] == 7
    assert config["engine_config"]["model"]["name"] == "tiny"


def test_lifecycle_timestamps_are_ordered(recorded):
    _, run, _ = recorded
    client, engine = _times(run.request_events, "client"), _times(run.request_events, "engine")
    t = client.add_prefix("c_").join(engine.add_prefix("e_"))
    chain = ["c_scheduled_send", "c_created", "c_sent", "e_arrival", "e_queued",
             "e_scheduled", "e_first_token", "c_first_token", "c_done"]  # fmt: skip
    served = t.dropna(subset=chain)
    assert len(served) >= 15
    for a, b in itertools.pairwise(chain):
        assert (served[a] <= served[b]).all(), (a, b)
    # A request served to the end finishes in the engine before the client sees its end;
    # a cancelled one is released by the engine after the client stopped listening.
    reasons = run.requests.set_index("request_id")["finish_reason"].astype(str)
    full = t.join(reasons).query("finish_reason == 'length'")
    assert len(full) >= 10
    assert (full["e_finished"] <= full["c_done"]).all()
    cancelled = t.join(reasons).query("finish_reason == 'cancelled'")
    assert len(cancelled) > 0
    # Closing the stream aborts in the engine before the client records the end.
    assert (cancelled["c_sent"] <= cancelled["e_aborted"]).all()
    assert (cancelled["e_aborted"] <= cancelled["c_done"]).all()


def test_every_forward_pass_has_a_step_and_events_point_at_steps(recorded):
    _, run, _ = recorded
    steps = run.steps
    ids = steps["step_id"].to_numpy()
    assert (ids == np.arange(len(ids))).all()  # one row per step, none missing
    assert ((steps["num_prefill_tokens"] + steps["num_decode_seqs"]) > 0).all()
    assert (steps["end_ns"] > steps["start_ns"]).all()
    referenced = run.request_events["step_id"].dropna().astype(int)
    assert set(referenced) <= set(ids)
    phases = run.spans[run.spans["category"] == "phase"]
    assert set(phases["step_id"].astype(int)) == set(ids)
    # Phases nest inside their step.
    joined = phases.merge(steps, on="step_id", suffixes=("", "_step"))
    assert (joined["start_ns"] >= joined["start_ns_step"]).all()
    assert (joined["start_ns"] + joined["dur_ns"] <= joined["end_ns"]).all()


def test_prefill_tokens_per_step_match_the_request_events(recorded):
    _, run, _ = recorded
    chunks = run.request_events[run.request_events["kind"] == "prefill_chunk"]
    per_step = chunks.groupby("step_id")["num_tokens"].sum()
    steps = run.steps.set_index("step_id")
    assert (steps.loc[per_step.index.astype(int), "num_prefill_tokens"]
            == per_step.to_numpy()).all()  # fmt: skip


def test_cancellation_and_warmup_are_recorded(recorded):
    _, run, options = recorded
    req = run.requests.set_index("request_id")
    assert int(req["is_warmup"].sum()) == options.workload.warmup
    cancelled = req[req["finish_reason"] == "cancelled"]
    assert len(cancelled) == 6  # 25 % of 24
    assert (cancelled["output_tokens"] == 2).all()
    # The engine saw the abort and released the request.
    aborted = run.request_events[run.request_events["kind"] == "aborted"]["request_id"]
    assert set(cancelled.index) <= set(aborted.astype(str))
    done = req[req["finish_reason"] == "length"]
    assert (done["output_digest"].str.len() == 32).all()


def test_prefix_cache_hits_are_recorded(recorded):
    _, run, _ = recorded
    assert run.requests["cached_tokens"].fillna(0).sum() > 0
    assert run.steps["num_cached_tokens"].fillna(0).sum() > 0


def test_same_seed_same_workload_and_outputs(recorded, tmp_path):
    _, first, options = recorded
    record_run(options, tmp_path / "b", command=["pytest"])
    second = load_run(tmp_path / "b")
    a = first.requests.set_index("request_id").sort_index()
    b = second.requests.set_index("request_id").sort_index()
    assert (a["prompt_tokens"] == b["prompt_tokens"]).all()
    full = a["finish_reason"] == "length"
    assert (a.loc[full, "output_digest"] == b.loc[full, "output_digest"]).all()


def test_profiler_window_spans_map_to_their_steps(tmp_path):
    options = RunOptions(
        ENGINE,
        _workload(requests=6, warmup=0, cancel=CancelSpec()),
        ProbeOptions(profile_steps=(2, 4), device_sampling=False),
    )
    record_run(options, tmp_path / "p", command=["pytest"])
    run = load_run(tmp_path / "p")
    info = run.manifest.extra["profiler_window"]
    assert info["captured_steps"] == [2, 4]
    assert (tmp_path / "p" / info["raw_trace"]).exists()
    spans = run.spans
    profiled = spans[~spans["category"].isin(["phase", "probe", "gc"])]
    assert len(profiled) == info["spans"] > 0
    assert profiled["step_id"].notna().all()  # every span in the window maps to a step
    assert set(profiled["step_id"].astype(int)) == {2, 3, 4}
    # On the run's clock, each op starts inside its step (to the clock sync's precision).
    slack = info["clock_sync_uncertainty_ns"] + 50_000
    joined = profiled.merge(run.steps, on="step_id", suffixes=("", "_step"))
    assert (joined["start_ns"] >= joined["start_ns_step"] - slack).all()
    assert (joined["start_ns"] <= joined["end_ns"] + slack).all()
    # The profiler's own start and stop are recorded, between steps, not inside them.
    overhead = spans[spans["category"] == "probe"]
    assert set(overhead["name"]) == {"profiler_start", "profiler_stop"}


def test_a_window_after_the_run_is_reported_not_silently_empty(tmp_path):
    options = RunOptions(
        ENGINE,
        _workload(requests=2, warmup=0, cancel=CancelSpec(), output_len=LengthSpec(value=2)),
        ProbeOptions(profile_steps=(10_000, 10_001), device_sampling=False),
    )
    record_run(options, tmp_path / "p", command=["pytest"])
    info = load_run(tmp_path / "p").manifest.extra["profiler_window"]
    assert info["captured_steps"] is None and "ended before" in info["reason"]


def test_text_is_stored_only_when_asked(recorded, tmp_path):
    _, run, _ = recorded
    assert not run.requests["args"].str.contains("output_text").any()
    options = RunOptions(
        ENGINE,
        _workload(requests=3, warmup=0, cancel=CancelSpec()),
        ProbeOptions(record_text=True, device_sampling=False),
    )
    record_run(options, tmp_path / "t", command=["pytest"])
    args = load_run(tmp_path / "t").requests["args"].map(json.loads)
    assert all("prompt_text" in a and "output_text" in a for a in args)
