"""`perfdiag compare`: the variables that changed, metric deltas with bootstrap intervals,
correctness from output digests, findings that appeared — on hand-built runs and on
runs of the reference engine that differ in one setting, in three, and in model seed."""

import json

import numpy as np
import pytest
import serving_runs as runs
from typer.testing import CliRunner

from perfdiag import load_run
from perfdiag.analyzers.compare import config_diff, correctness, metric_deltas
from perfdiag.analyzers.serving import analyze_serving
from perfdiag.cli import app
from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec
from perfdiag.traces.manifest import Manifest
from perfdiag.traces.schema import Request


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at the terminal's width


ENV = {
    "python": "3.11.7",
    "cpu_model": "cpu",
    "git_revision": "abc",
    "packages": {"torch": "2.4.0", "numpy": "2.0"},
}


def manifest(engine=None, workload=None, env=None, probes=None, faults=None) -> Manifest:
    config = {
        "run_options": {
            "engine": {"chunk_size": 64, "max_seqs": 16} | (engine or {}),
            "workload": {"seed": 0, "requests": 10, "arrival": {"mode": "open", "rate": 2.0}}
            | (workload or {}),
            "probes": {"sample_period_s": 0.2} | (probes or {}),
        }
    }
    if faults:
        config["faults"] = faults
    return Manifest(1, "0.1.0", "x", "", "complete", [], config, ENV | (env or {}), {})


def test_one_changed_setting_is_one_variable():
    diff = config_diff(manifest(), manifest(engine={"chunk_size": 128}))
    assert [(c.name, c.a, c.b) for c in diff.variables] == [("engine.chunk_size", "64", "128")]


def test_arrival_rate_and_cap_are_separate_variables_and_probes_are_not_counted():
    b = manifest(
        workload={"arrival": {"mode": "open", "rate": 4.0, "concurrency": 2}},
        probes={"sample_period_s": 0.1},
    )
    diff = config_diff(manifest(), b)
    assert {c.name for c in diff.variables} == {
        "workload.arrival.rate",
        "workload.arrival.concurrency",
    }
    assert [c.name for c in diff.changes if c.kind == "measurement"] == ["probes.sample_period_s"]


def test_environment_changes_are_variables_and_a_dirty_tree_is_a_note():
    b = manifest(env={"packages": {"torch": "2.5.0", "numpy": "2.0"}, "git_revision": "abc-dirty"})
    diff = config_diff(manifest(), b)
    assert [c.name for c in diff.variables] == ["environment.torch"]
    assert diff.notes == ("the source tree was clean in A and dirty in B",)
    unset = manifest(faults={"input_delay_ms": 0.0, "step_gap_ms": 3.0})
    assert [c.name for c in config_diff(manifest(), unset).variables] == ["faults.step_gap_ms"]


def _ttft_run(path, ttft_ms, warmup=0):
    c = runs.client
    requests, events = [], []
    for i, ttft in enumerate(ttft_ms):
        rid, sent = f"r{i:03d}", 20.0 * i
        requests.append(Request(rid, 8, 1, None, "stop", is_warmup=i < warmup))
        events += [
            c(rid, "created", sent),
            c(rid, "sent", sent),
            c(rid, "first_token", sent + ttft),
            c(rid, "chunk", sent + ttft, 1),
            c(rid, "done", sent + ttft, 1),
        ]
    return analyze_serving(load_run(runs.write(path, requests, events)), steady=False)


def test_bootstrap_intervals_find_a_real_shift_and_not_a_null_one(tmp_path):
    rng = np.random.default_rng(3)
    base = rng.lognormal(np.log(20), 0.3, 200)
    a = _ttft_run(tmp_path / "a", base)
    b = _ttft_run(tmp_path / "b", base + 5.0)  # every TTFT 5 ms longer
    a2 = _ttft_run(tmp_path / "a2", rng.permutation(base))  # same values, other order
    shifted = {d.metric: d for d in metric_deltas(a, b, n_boot=400)}
    p50 = shifted["ttft.p50"]
    assert p50.delta == pytest.approx(5.0, abs=1e-6)
    assert p50.ci_low < 5.0 < p50.ci_high and p50.ci_low > 0
    assert p50.significant and p50.verdict == "worse"
    same = {d.metric: d for d in metric_deltas(a, a2, n_boot=400)}
    assert same["ttft.p50"].delta == pytest.approx(0.0, abs=1e-9)
    assert same["ttft.p50"].ci_low < 0 < same["ttft.p50"].ci_high
    assert same["ttft.p50"].verdict == "same"
    again = {d.metric: d for d in metric_deltas(a, b, n_boot=400)}
    assert again["ttft.p99"] == shifted["ttft.p99"]  # seeded: the same intervals


def _digest_run(path, digests, workload=None):
    reqs = [Request(f"r{i}", 4, 3, None, "length", output_digest=d) for i, d in enumerate(digests)]
    config = {"run_options": {"workload": workload or {"seed": 0}}}
    from perfdiag.traces.writer import RunWriter

    with RunWriter(path, command=["t"], config=config, environment_info={}) as w:
        w.table("requests").extend(reqs)
    return load_run(path)


def test_correctness_counts_requests_whose_outputs_differ(tmp_path):
    a = _digest_run(tmp_path / "a", ["x", "y", "z", "w"])
    b = _digest_run(tmp_path / "b", ["x", "Y", "z", "W"])
    c = correctness(a, b)
    assert c.comparable and c.compared == 4 and c.mismatched == 2
    assert c.mismatch_rate == 0.5 and c.mismatched_ids == ("r1", "r3")
    assert c.logprobs == "not recorded"
    other = _digest_run(tmp_path / "c", ["x", "y", "z", "w"], workload={"seed": 1})
    assert not correctness(a, other).comparable
    assert "workload seed" in correctness(a, other).reason


# -- end to end on the reference engine ------------------------------------------------------
def _record(path, **engine):
    options = RunOptions(
        EngineOptions(
            **({"preset": "tiny", "kv_cache_mb": 4.0, "max_seqs": 8, "chunk_size": 32} | engine)
        ),
        WorkloadSpec(
            requests=20,
            warmup=2,
            seed=3,
            arrival=ArrivalSpec("open", rate=40.0),
            prompt_len=LengthSpec.parse("uniform:16:96"),
            output_len=LengthSpec.parse("uniform:4:16"),
        ),
        ProbeOptions(device_sampling=False),
    )
    record_run(options, path, command=["pytest"])
    return path


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    return {
        "a": _record(root / "a"),
        "chunk": _record(root / "chunk", chunk_size=128),
        "three": _record(root / "three", chunk_size=128, max_seqs=4, kv_cache_mb=8.0),
        "seed": _record(root / "seed", model_seed=1),
    }


def compare(a, b, *extra):
    result = CliRunner().invoke(
        app, ["compare", str(a), str(b), "--resamples", "200", *extra], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_chunk_size_alone_is_one_variable_with_intervals(engine_runs):
    text = compare(engine_runs["a"], engine_runs["chunk"])
    assert "one main variable changed: engine.chunk_size (32 → 128)" in text
    assert "warning" not in text.split("end-to-end metrics")[0]
    assert "95% interval of Δ" in text
    assert "outputs identical for all 20 requests compared" in text
    data = json.loads(compare(engine_runs["a"], engine_runs["chunk"], "--json"))
    ttft = next(d for d in data["deltas"] if d["metric"] == "ttft.p50")
    assert ttft["ci_low"] <= ttft["delta"] <= ttft["ci_high"]


def test_three_settings_warn_and_name_them(engine_runs):
    text = compare(engine_runs["a"], engine_runs["three"])
    assert (
        "warning: 3 main variables changed (engine.chunk_size, engine.kv_cache_mb, engine.max_seqs)"
    ) in text
    data = json.loads(compare(engine_runs["a"], engine_runs["three"], "--json"))
    f = next(f for f in data["triage"]["findings"] if f["check"] == "several-variables")
    assert f["severity"] == "warning" and f["value"] == 3


def test_another_model_seed_is_a_correctness_failure(engine_runs):
    text = compare(engine_runs["a"], engine_runs["seed"])
    assert "one main variable changed: engine.model_seed (0 → 1)" in text
    assert "correctness failure (step 7): outputs differ for 20 of 20 requests" in text
    assert "mismatch rate 100.0%" in text
    assert "CRITICAL step 7: Outputs differ from the baseline for 20 of 20 requests" in text


def test_analyze_against_a_baseline_runs_steps_6_and_7(engine_runs):
    result = CliRunner().invoke(
        app, ["analyze", str(engine_runs["seed"]), "--baseline", str(engine_runs["a"]),
              "--no-report"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads((engine_runs["seed"] / "results" / "findings.json").read_text())
    assert data["baseline"] == load_run(engine_runs["a"]).manifest.run_id
    differ = next(f for f in data["findings"] if f["check"] == "outputs-differ")
    assert differ["severity"] == "critical" and differ["value"] == 1.0
    status = {s["step"]: s["status"] for s in data["steps"]}
    assert status[6] == "pass" and status[7] == "fired"


def test_findings_that_appeared_disappeared_or_changed_severity():
    from perfdiag.analyzers.compare import finding_changes
    from perfdiag.analyzers.findings import Finding, Triage

    def f(check, step, severity):
        return Finding(check, step, "", severity, f"{check} title", "", (), (), (), (), 0, 0.5)

    def triage(*findings):
        return Triage("r", "p", "triage", findings, (), ())

    a = triage(f("host-bound", 4, "critical"), f("slow-input", 3, "warning"),
               f("cache-hits", 5, "info"), f("latency-regressed", 7, "warning"))  # fmt: skip
    b = triage(f("slow-input", 3, "critical"), f("preemption-storm", 4, "warning"),
               f("outputs-differ", 7, "critical"))  # fmt: skip
    changes = {c.check: (c.status, c.severity_a, c.severity_b) for c in finding_changes(a, b)}
    assert changes == {
        "host-bound": ("disappeared", "critical", None),
        "slow-input": ("worse", "warning", "critical"),
        "preemption-storm": ("appeared", None, "warning"),
    }  # info findings and the comparison steps 6-7 are left out
