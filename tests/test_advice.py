"""Advice as data and its verification (analyzers/actions.py, playbooks/verify.py), the
step cost model's per-chunk term, and `perfdiag analyze --verify-advice` on a real run:
the advised chunk is applied with --like semantics and the targeted metric improves."""

import json
import subprocess
import sys

import numpy as np
import pytest
import serving_runs as runs

from perfdiag import load_run
from perfdiag.analyzers.actions import Action, Setting, other_action, run_action
from perfdiag.analyzers.findings import Finding
from perfdiag.analyzers.step_cost import fit_step_cost
from perfdiag.analyzers.steptime import StepTimeline
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext
from perfdiag.playbooks.verify import rerun_options, verify
from perfdiag.probes.faults import FaultOptions
from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

MS, US = 1e-3, 1e-6


def test_settings_render_as_run_flags():
    assert Setting("engine.chunk_size", 16, 128).flag == "--chunk-size 128"
    assert Setting("engine.prefix_cache", False, True).flag == "--prefix-cache"
    assert Setting("engine.prefix_cache", True, False).flag == "--no-prefix-cache"
    assert Setting("engine.max_wait_ms", None, 800.0).flag == "--max-wait-ms 800"
    a = run_action("ttft.p50", Setting("engine.chunk_size", 16, 128),
                   Setting("workload.concurrency", 1, 6))  # fmt: skip
    assert a.flags == "--chunk-size 128 --concurrency 6"
    assert a.command("runs/x") == "perfdiag run --like runs/x --chunk-size 128 --concurrency 6"
    assert other_action("code", "ttft.p50", "profile it").command("runs/x") == ""
    with pytest.raises(ValueError, match="no run flag"):
        Action("run", "ttft.p50", (Setting("engine.nonsense", 1, 2),))


def _record(path, faults=None, **engine):
    options = RunOptions(
        EngineOptions(preset="tiny", kv_cache_mb=8.0, **engine),
        WorkloadSpec(requests=20, warmup=2, seed=5, arrival=ArrivalSpec("closed", 2),
                     prompt_len=LengthSpec.parse("uniform:160:288"),
                     output_len=LengthSpec.parse("uniform:4:8")),
        ProbeOptions(device_sampling=False),
    )  # fmt: skip
    record_run(options, path, command=["pytest"], faults=faults)
    return path


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    """Long prompts cut into 16-token chunks, with a fault that must survive a re-run."""
    return _record(tmp_path_factory.mktemp("advice") / "sliced", FaultOptions(step_gap_ms=0.2),
                   chunk_size=16)  # fmt: skip


def test_a_rerun_changes_only_the_advised_options_and_keeps_the_faults(sliced):
    run = load_run(sliced)
    action = run_action("ttft.p50", Setting("engine.chunk_size", 16, 128),
                        Setting("workload.concurrency", 2, 3))  # fmt: skip
    options, faults = rerun_options(run, action)
    before = RunOptions.from_dict(run.manifest.config["run_options"])
    assert options.engine.chunk_size == 128 and options.workload.arrival.concurrency == 3
    assert options.engine.preset == before.engine.preset
    assert options.workload.seed == before.workload.seed == 5
    assert options.workload.prompt_len == before.workload.prompt_len
    assert faults == FaultOptions(step_gap_ms=0.2)


def test_runs_a_rerun_cannot_recreate_say_why(tmp_path):
    imported = runs.write(tmp_path / "imported", [], [], [runs.step(0, 0, 1)])
    action = run_action("ttft.p50", Setting("engine.chunk_size", 16, 128))
    assert "not recorded by perfdiag run" in rerun_options(load_run(imported), action)
    finding = Finding(
        "host-bound",
        4,
        "",
        "warning",
        "t",
        "",
        (),
        (),
        (),
        (),
        0.5,
        0.5,
        action=other_action("code", "itl.p50", "Profile the step loop."),
    )
    v = verify(TriageContext(load_run(imported)), finding, tmp_path / "never")
    assert v.verdict == "not applicable" and "Profile the step loop" in v.reason
    assert not (tmp_path / "never").exists()


def test_a_sliced_prompt_pays_the_host_gap_of_every_step_beyond_its_first(sliced):
    """The sliced run waits at least its injected 0.2 ms between steps: chunk-too-small
    counts that gap for every step but a prompt's first, and says what its share would be
    without the gaps."""
    f = run_triage(TriageContext(load_run(sliced))).by_check("chunk-too-small")
    e = {x.name: x.value for x in f.evidence}
    assert e["steps_per_prefill"] > 5
    assert e["gap_ms"] >= 0.2 * (e["steps_per_prefill"] - 1) * 0.9
    assert e["gap_ms"] < e["overhead_ms"]
    assert 0 < e["without_host_bound"] < f.value


def test_verify_advice_applies_the_top_advice_and_the_target_improves(sliced, tmp_path):
    triage = run_triage(TriageContext(load_run(sliced)))
    top = triage.top
    assert top.check == "chunk-too-small" and top.action.settings[0].option == "engine.chunk_size"
    assert top.action.settings[0].now == 16 and top.action.settings[0].to > 16
    assert top.action.flags in top.recommendations[0]  # the first advice is the action
    out = tmp_path / "after"
    cmd = [sys.executable, "-m", "perfdiag", "analyze", str(sliced), "--no-report",
           "--verify-advice", "--verify-out", str(out)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "advice improved" in result.stdout, result.stdout[-2000:]
    data = json.loads((out / "results" / "verification.json").read_text())
    assert data["verdict"] == "improved" and data["target"]["b"] < data["target"]["a"]
    after = load_run(out).manifest.config
    assert after["run_options"]["engine"]["chunk_size"] == top.action.settings[0].to
    assert after["faults"]["step_gap_ms"] == 0.2


@pytest.mark.parametrize(
    "args",
    [["--finding", "chunk-too-small"], ["--verify-advice", "--finding", "no-such-check"]],
)
def test_bad_verify_options_are_one_line_errors(sliced, args):
    cmd = [sys.executable, "-m", "perfdiag", "analyze", str(sliced), "--no-report", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("perfdiag: error:") and "Traceback" not in result.stderr


def _steps(path, chunk_cost, rng, equal_chunks=False):
    rows, t = [], 0.0
    for i in range(300):
        seqs = int(rng.choice([0, 0, 1, 2, 3]))
        tokens = seqs * 16 if equal_chunks else int(rng.integers(1, 200)) * seqs
        d = int(rng.integers(0, 16))
        dur = 0.5 * MS + chunk_cost * seqs + 20 * US * tokens + 150 * US * d
        dur += rng.normal(0, 20 * US)
        rows.append(runs.step(i, t / MS, (t + dur) / MS, pf_seqs=seqs, pf_tokens=tokens,
                              decode=d))  # fmt: skip
        t += dur + 0.1 * MS
    return StepTimeline.from_run(load_run(runs.write(path, [], [], rows)), runs.T0)


def test_the_cost_model_prices_a_chunk_apart_from_its_tokens(tmp_path):
    cost = fit_step_cost(_steps(tmp_path / "varied", 1.5 * MS, np.random.default_rng(3)))
    assert cost.per_prefill_chunk_s == pytest.approx(1.5 * MS, rel=0.05)
    assert cost.per_prefill_token_s == pytest.approx(20 * US, rel=0.05)
    assert cost.slice_cost_s == pytest.approx(2.0 * MS, rel=0.05)
    # no chunk cost: the term stays out (Schwarz's criterion) or prices next to nothing
    plain = fit_step_cost(_steps(tmp_path / "plain", 0.0, np.random.default_rng(4)))
    assert plain.per_prefill_chunk_s < 0.05 * MS
    assert plain.per_prefill_token_s == pytest.approx(20 * US, rel=0.05)


def test_chunks_all_alike_keep_one_positive_price(tmp_path):
    # 16 tokens per chunk always: a chunk's cost and its tokens' are one number
    cost = fit_step_cost(_steps(tmp_path / "alike", 1.5 * MS, np.random.default_rng(5), True))
    per_chunk = cost.per_prefill_chunk_s + 16 * cost.per_prefill_token_s
    assert per_chunk == pytest.approx(1.5 * MS + 16 * 20 * US, rel=0.05)
    assert min(cost.fixed_s, cost.per_prefill_chunk_s, cost.per_prefill_token_s) >= 0
