"""The diagnosis of a real vLLM, in CI without vLLM: runs that `perfdiag run --launch` recorded
against vLLM 0.32.0 (the CPU build, SmolLM2-135M) on this project's 2-core machine, one
everyday fault each (tests/data/vllm/runs/, recorded by `PERFDIAG_VLLM_KEEP=… make test-vllm`,
tests/test_vllm_live.py says how each was launched and driven).

Each must be named first with advice in vLLM's own flags, its evidence must say it comes from
the server's metrics, and the light load must raise nothing critical."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfdiag.analyzers.actions import FLAGS
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext
from perfdiag.traces.reader import load_run

RUNS = Path(__file__).parent / "data" / "vllm" / "runs"
FAULTS = {
    # case: (the check named first, the flag its advice must name)
    "seq-cap": ("server-seq-cap", "--max-num-seqs"),
    "kv-pressure": ("server-kv-pressure", "--num-gpu-blocks-override"),
    "budget-sliced": ("server-prefill-sliced", "--max-num-batched-tokens"),
    "prefix-off": ("prefix-not-reused", "--enable-prefix-caching"),
}


def _triage(case: str):
    run = load_run(RUNS / case)
    ctx = TriageContext(run)
    return run, ctx, run_triage(ctx)


@pytest.mark.parametrize("case", sorted(FAULTS))
def test_each_fault_is_named_first_in_vllms_terms(case):
    check, flag = FAULTS[case]
    _, _, triage = _triage(case)
    top = triage.top
    assert top is not None and top.check == check, [f.check for f in triage.causes]
    assert top.severity == "critical"
    assert flag in " ".join(top.recommendations)
    source = next(e.value for e in top.evidence if e.name == "source")
    assert "server metrics (vllm:" in source


def test_a_light_load_raises_nothing_critical():
    _, _, triage = _triage("light")
    assert not [f.check for f in triage.findings if f.severity == "critical"]
    # engine_ref's checks that need its own record say so instead of guessing
    outcomes = {c.check: c for s in triage.steps for c in s.checks}
    assert outcomes["queue-dominates-ttft"].status == "not-evaluated"
    assert outcomes["server-queue-dominates-ttft"].status == "passed"


@pytest.mark.parametrize("case", ["seq-cap", "kv-pressure", "budget-sliced", "prefix-off", "light"])
def test_the_servers_ttft_accounts_for_the_clients(case):
    """Server TTFT (its histogram's mean over the same requests) plus what lies outside the
    server's record (client, loopback, the server's HTTP layer before it stamps arrival) is
    the client's TTFT: that outside part is a few ms on loopback (12 ms under the light
    load here, 14 % of its 83 ms TTFT) and a few percent of a queued TTFT."""
    from perfdiag.playbooks.facts_target import server_ttft_parts

    _, ctx, _ = _triage(case)
    fact = server_ttft_parts(ctx)
    values = fact.values()
    assert values["server_requests"] == values["requests"]  # the scrapes bracket the run
    assert abs(values["outside_ms"]) <= max(0.05 * values["ttft_ms"], 20.0)
    parts = values["queue_ms"] + values["prefill_ms"] + values["frontend_ms"]
    assert parts == pytest.approx(values["server_ttft_ms"])


def test_the_run_records_the_server_not_engine_ref():
    run = load_run(RUNS / "seq-cap")
    config = run.manifest.config
    assert "engine" not in config["run_options"]
    server = config["server"]
    assert server["kind"] == "vllm" and server["version"].startswith("0.32")
    assert server["launch"]["args"]["max_num_seqs"] == 2
    assert server["info"]["vllm:cache_config_info"]["block_size"] == "128"


@pytest.mark.parametrize("case", sorted(FAULTS))
def test_the_advice_is_a_relaunch_with_vllms_flag_changed(case):
    """--verify-advice relaunches the server with only the advised flag changed (and a free
    port), the same workload and seed."""
    from perfdiag.playbooks.verify import rerun_options
    from perfdiag.probes.server_launch import LaunchSpec

    run, _, triage = _triage(case)
    action = triage.top.action
    assert action is not None and action.relaunches
    options, spec = rerun_options(run, action)
    assert isinstance(spec, LaunchSpec)
    recorded = run.manifest.config["server"]["launch"]
    assert spec.env == recorded["env"]  # VLLM_CPU_KVCACHE_SPACE and the like kept
    setting = action.settings[0]
    flag = FLAGS[tuple(setting.option.split(".", 1))]
    after = spec.words
    assert "--port" not in after
    value = [] if isinstance(setting.to, bool) else [str(setting.to)]
    assert after[-1 - len(value) :] == [flag, *value]  # the advised flag, set once, last
    # every other word of the launch as it was
    others = _without(_without(recorded["argv"], "--port", 1), flag, len(value))
    assert _without(after, flag, len(value)) == _without(others, "--no-enable-prefix-caching", 0)
    assert options.workload.seed == run.manifest.config["run_options"]["workload"]["seed"]


def _without(words: list[str], flag: str, values: int) -> list[str]:
    """`words` without `flag` and the `values` words after it."""
    if flag not in words:
        return words
    at = words.index(flag)
    return words[:at] + words[at + 1 + values :]


def test_a_server_started_elsewhere_cannot_be_relaunched(tmp_path):
    import json
    import shutil

    from perfdiag.analyzers.actions import Setting, run_action
    from perfdiag.playbooks.verify import rerun_options

    copy = tmp_path / "seq-cap"
    shutil.copytree(RUNS / "seq-cap", copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["config"]["server"]["launch"] = None  # as `perfdiag run --target URL` records
    (copy / "manifest.json").write_text(json.dumps(manifest))
    run = load_run(copy)
    # without its launch the cap is not known, so no check advises it: an action by hand
    action = run_action("ttft.p50", Setting("server.max_num_seqs", 2, 16))
    why = rerun_options(run, action)
    assert isinstance(why, str) and "started elsewhere" in why and "--max-num-seqs" in why


def test_analyze_details_shows_the_servers_own_record(tmp_path):
    import shutil

    from typer.testing import CliRunner

    from perfdiag.cli import app

    run = tmp_path / "kv"
    shutil.copytree(RUNS / "kv-pressure", run)
    result = CliRunner().invoke(app, ["analyze", str(run), "--details"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "the server's own record (vllm /metrics" in text
    assert "preemptions" in text and "KV cache usage" in text
    assert "(5,000–10,000)" in text  # a percentile names its bucket
