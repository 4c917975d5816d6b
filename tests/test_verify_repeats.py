"""Verification with repeats (playbooks/verify.py, verify_repeats.py): the verdict over
runs on synthetic run tables, the target fixed per check in the playbook, and
`perfdiag analyze --verify-advice --repeats 2` on a short run of the tiny preset."""

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from verify_runs import record_tiny

from perfdiag import load_run
from perfdiag.analyzers.actions import Setting, run_action
from perfdiag.analyzers.findings import Finding
from perfdiag.playbooks.evaluate import _finding
from perfdiag.playbooks.facts import Fact, load_registry
from perfdiag.playbooks.schema import TRIAGE_FILE, PlaybookError, load_playbook
from perfdiag.playbooks.verify import VERDICTS, verify
from perfdiag.playbooks.verify_repeats import runs_delta
from perfdiag.probes.run_options import RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

MS = 1e-3
PLAYBOOKS = Path(__file__).parent.parent / "playbooks"


def _runs(centres_ms, n=200, spread_ms=5.0, seed=0):
    """One synthetic run per centre: n requests' TTFT around it (seconds, request ids)."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(c, spread_ms, n) * MS, np.arange(n)) for c in centres_ms]


def test_a_change_far_beyond_run_to_run_noise_is_better_or_worse():
    a, b = _runs([100, 104, 98], seed=1), _runs([60, 63, 58], seed=2)
    down = runs_delta("ttft.p50", a, b)
    assert down.verdict == "better" and not down.overlap
    assert down.delta.ci_high < 0 and down.delta.b == pytest.approx(60, abs=3)
    assert down.runs == (3, 3)
    assert runs_delta("ttft.p50", b, a).verdict == "worse"


def test_a_shift_inside_the_runs_spread_is_inconclusive():
    # the sides' means differ by 3 ms, the runs scatter by 20: no side can be told apart
    a, b = _runs([100, 140, 120], seed=3), _runs([103, 143, 123], seed=4)
    assert runs_delta("ttft.p50", a, b).verdict == "same"


def test_one_run_a_side_says_worse_where_the_runs_overlap():
    """A0 → B0 alone moves 30 ms with 5 ms inside a run: request-level resampling calls it
    worse; over three runs a side, whose centres scatter by ±20 ms, the sides overlap."""
    a, b = _runs([100, 140, 120], seed=5), _runs([130, 95, 145], seed=6)
    single = runs_delta("ttft.p50", a[:1], b[:1])
    assert single.verdict == "worse" and single.delta.ci_low > 0
    over_runs = runs_delta("ttft.p50", a, b)
    assert over_runs.verdict == "same" and over_runs.overlap
    assert over_runs.delta.ci_low < 0 < over_runs.delta.ci_high


def test_no_interval_without_a_percentile_or_values():
    a = _runs([100])
    assert runs_delta("throughput.output", a, a) is None
    assert runs_delta("ttft.p50", a, [(np.zeros(0), np.zeros(0, int))]) is None


# -- the target fixed in the playbook ------------------------------------------------------
def _acting_functions() -> set[str]:
    """Functions in playbooks/ that build an action, directly or through another one."""
    refs: dict[str, set[str]] = {}
    for path in PLAYBOOKS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                refs.setdefault(node.name, set()).update(names)
    acting = {"run_action", "other_action", "server_action", "_CODE_ACTIONS"}
    while True:
        more = {f for f, names in refs.items() if names & acting} - acting
        if not more:
            return acting
        acting |= more


# Checks whose fact acts only for other parameters (ttft_part_share: input, queue and
# others' prefill; itl_tail_share: interference).
NEVER_ACT = {"ttft-host-gaps", "ttft-return", "itl-preemption",
             "itl-host-gaps", "itl-delivery-stalls"}  # fmt: skip


def test_every_check_whose_fact_acts_has_a_fixed_target():
    acting, facts = _acting_functions(), load_registry()
    checks = [c for s in load_playbook().steps for c in s.checks]
    acts = {c.id for c in checks if facts[c.fact].fn.__name__ in acting} - NEVER_ACT
    assert len(acts) >= 15  # the closure found the facts (a broken walk finds none)
    assert {c.id for c in checks if c.verify} == acts
    assert not {c.id for c in checks if c.verify} & NEVER_ACT


def test_the_finding_takes_the_playbooks_target_not_the_facts():
    check = load_playbook().check("chunk-too-small")
    assert check.verify == "ttft.p50"
    action = run_action("e2e.p99", Setting("engine.chunk_size", 16, 128))
    f = _finding(check, 3, "", "warning", Fact(0.5, (), action=action))
    assert f.action.target == "ttft.p50" and f.action.settings == action.settings


def test_a_verify_target_that_is_no_metric_is_a_playbook_error(tmp_path):
    data = yaml.safe_load(TRIAGE_FILE.read_text())
    data["steps"][3]["checks"][0]["verify"] = "ttft.p42"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlaybookError, match="`verify` must be one of"):
        load_playbook(path)


# -- re-running ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    return record_tiny(tmp_path_factory.mktemp("verify-repeats") / "sliced", chunk_size=16)


def _chunk_finding(to=128):
    action = run_action("ttft.p50", Setting("engine.chunk_size", 16, to))
    return Finding("chunk-too-small", 3, "", "warning", "t", "", (), (), (), (), 0.5, 0.5,
                   action=action)  # fmt: skip


def test_verify_advice_with_repeats_runs_both_sides_and_judges_over_runs(sliced, tmp_path):
    from perfdiag.playbooks.schema import load_playbook

    out = tmp_path / "after"
    cmd = [sys.executable, "-m", "perfdiag", "analyze", str(sliced), "--no-report",
           "--verify-advice", "--repeats", "2", "--verify-out", str(out)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "2 runs a side" in result.stdout
    data = json.loads((out / "results" / "verification.json").read_text())
    assert data["verdict"] in VERDICTS and data["repeats"] == 2
    assert data["verdict"] != "worse", data["reason"]
    assert data["action"]["target"] == load_playbook().check(data["check"]).verify
    assert len(data["runs_a"]) == len(data["runs_b"]) == 2
    assert "2 runs against 2" in data["reason"] and data["interval_a"] and data["interval_b"]
    a2, b2 = (load_run(Path(p)).manifest.config["run_options"] for p in
              (data["runs_a"][1], data["runs_b"][1]))  # fmt: skip
    chunk = data["action"]["settings"][0]["to"]
    assert a2["engine"]["chunk_size"] == 16 and b2["engine"]["chunk_size"] == chunk
    assert a2["workload"]["seed"] == b2["workload"]["seed"] == 5  # the same requests


def test_a_second_changed_variable_makes_an_improvement_inconclusive(sliced, tmp_path):
    def record_elsewhere(options, out_dir, **kwargs):  # the advice, and a bigger KV pool
        engine = dataclasses.replace(options.engine, kv_cache_mb=16.0)
        return record_run(dataclasses.replace(options, engine=engine), out_dir, **kwargs)

    from perfdiag.playbooks.facts import TriageContext

    v = verify(TriageContext(load_run(sliced)), _chunk_finding(), tmp_path / "b",
               record=record_elsewhere)  # fmt: skip
    assert v.target.verdict == "better"  # the chunk alone would have been "improved"
    assert v.verdict == "inconclusive"
    assert set(v.variables) == {"engine.chunk_size", "engine.kv_cache_mb"}
    assert "2 main variables changed" in v.reason


def test_repeats_below_one_are_refused(sliced, tmp_path):
    from perfdiag.errors import ConfigError
    from perfdiag.playbooks.facts import TriageContext

    with pytest.raises(ConfigError, match="at least 1"):
        verify(TriageContext(load_run(sliced)), _chunk_finding(), tmp_path / "x", repeats=0)
    cmd = [sys.executable, "-m", "perfdiag", "analyze", str(sliced), "--no-report",
           "--repeats", "2"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "go with --verify-advice" in result.stderr


def test_a_launched_server_is_relaunched_for_every_run_of_both_sides(tmp_path):
    """--repeats with a server perfdiag launched: side A relaunches the recorded command
    (a free port), side B the same with the advised flag; each run drives the same load."""
    import shlex

    from perfdiag.playbooks.facts import TriageContext
    from perfdiag.probes.http_session import HttpOptions, record_http_run
    from perfdiag.probes.server_launch import LaunchSpec

    fake = Path(__file__).parent / "fake_vllm.py"
    spec = LaunchSpec(f"{shlex.quote(sys.executable)} {shlex.quote(str(fake))} "
                      "--max-num-seqs 2", env={"FAKE_FLAG": "1"})  # fmt: skip
    options = RunOptions(workload=WorkloadSpec(
        requests=4, warmup=0, seed=7, arrival=ArrivalSpec(mode="closed", concurrency=2),
        prompt_len=LengthSpec(value=6), output_len=LengthSpec(value=4)))  # fmt: skip
    record_http_run(options, tmp_path / "run", http=HttpOptions(launch=spec))
    action = run_action("ttft.p50", Setting("server.max_num_seqs", 2, 4))
    finding = Finding("server-seq-cap", 3, "", "warning", "t", "", (), (), (), (), 0.5, 0.5,
                      action=action)  # fmt: skip
    v = verify(TriageContext(load_run(tmp_path / "run")), finding, tmp_path / "b", repeats=2)
    assert v.verdict in VERDICTS and len(v.runs_a) == len(v.runs_b) == 2
    launched = [load_run(Path(p)).manifest.config["server"]["launch"]
                for p in (*v.runs_a[1:], *v.runs_b)]  # fmt: skip
    assert [x["args"]["max_num_seqs"] for x in launched] == [2, 4, 4]
    assert all(x["env"] == {"FAKE_FLAG": "1"} for x in launched)
    seeds = {load_run(Path(p)).manifest.config["run_options"]["workload"]["seed"]
             for p in (*v.runs_a, *v.runs_b)}  # fmt: skip
    assert seeds == {7}
