"""Step 1's `not-reproducible` (fact `unpinned`, playbooks/facts_gate.py): what a run must
record to be reproduced. A run against a server (`perfdiag run --target/--launch`) is pinned
by the server — its version and launch arguments — never by engine_ref's configuration or
torch, which the client does not use; engine runs and imported traces keep their pins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext, evaluate_fact
from perfdiag.traces.reader import load_run
from perfdiag.traces.writer import RunWriter

ENV = {"python": "3.11.7", "packages": {"torch": "2.4"}, "cpu_model": "x86", "git_revision": "abc"}
WORKLOAD = {"workload": {"seed": 0, "requests": 8}}
LAUNCH = {"argv": ["vllm", "serve", "m", "--max-num-seqs", "2"], "args": {"max_num_seqs": 2}}


def _run(tmp_path, config: dict, env: dict = ENV):
    path = tmp_path / "run"
    with RunWriter(path, command=["t"], config=config, environment_info=env):
        pass
    return load_run(path)


def _unpinned(run):
    values = evaluate_fact("unpinned", TriageContext(run), {}).values()
    return values["missing"].split(", "), values["pinned"].split(", "), values


def _server(launch) -> dict:
    return {"kind": "vllm", "version": "0.32.0", "models": ["m"], "launch": launch, "info": {}}


def test_a_launched_server_is_pinned_by_its_version_and_launch_arguments(tmp_path):
    no_torch = {k: v for k, v in ENV.items() if k != "packages"}  # the client needs no torch
    config = {"run_options": WORKLOAD, "target": {"url": "http://h"}, "server": _server(LAUNCH)}
    missing, pinned, values = _unpinned(_run(tmp_path, config, no_torch))
    assert missing == ["none"]
    assert "server version" in pinned and "server launch arguments" in pinned
    assert "engine configuration" not in pinned and "framework versions" not in pinned
    assert "note" not in values


def test_a_server_started_elsewhere_lacks_its_launch_arguments(tmp_path):
    config = {"run_options": WORKLOAD, "target": {"url": "http://h"}, "server": _server(None)}
    missing, pinned, values = _unpinned(_run(tmp_path, config))
    assert missing == ["server launch arguments"]
    assert "server version" in pinned
    assert "not launched by perfdiag run --launch" in values["note"]
    assert "engine configuration" not in missing + pinned


def test_an_older_target_run_is_not_pinned_by_engine_refs_defaults(tmp_path):
    """Before `config.server`, target runs recorded engine_ref's default options as
    `run_options.engine` (never the server's) and the server's header in `config.target`."""
    options = {**WORKLOAD, "engine": {"max_seqs": 64}}
    config = {"run_options": options, "target": {"url": "http://h", "server": "uvicorn"}}
    missing, _, values = _unpinned(_run(tmp_path, config))
    assert missing == ["server version", "server launch arguments"]
    assert "not launched" in values["note"]


def test_engine_runs_keep_their_pins(tmp_path):
    config = {"run_options": {**WORKLOAD, "engine": {"max_seqs": 4}}}
    missing, pinned, values = _unpinned(_run(tmp_path, config))
    assert missing == ["none"] and "note" not in values
    assert pinned == [
        "perfdiag version",
        "python version",
        "framework versions",
        "hardware (CPU/GPU model)",
        "code revision",
        "engine configuration",
        "workload",
        "workload seed",
    ]
    no_torch = {k: v for k, v in ENV.items() if k != "packages"}
    missing, _, _ = _unpinned(_run(tmp_path / "b", {"run_options": WORKLOAD}, no_torch))
    assert missing == ["framework versions", "engine configuration"]


def test_perfdiag_serves_own_run_is_an_engine_run(tmp_path):
    """`perfdiag serve` records its HTTP settings as `server` beside its engine_config."""
    config = {"server": {"host": "127.0.0.1", "port": 0}, "engine_config": {"max_seqs": 4}}
    missing, pinned, _ = _unpinned(_run(tmp_path, config))
    assert "engine configuration" in pinned and "server version" not in missing + pinned


def test_the_finding_on_a_recorded_vllm_run_started_elsewhere(tmp_path):
    copy = tmp_path / "light"
    shutil.copytree(Path(__file__).parent / "data" / "vllm" / "runs" / "light", copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    launched = run_triage(TriageContext(load_run(copy))).by_check("not-reproducible")
    assert launched is None  # launched by perfdiag run --launch: everything is pinned
    manifest["config"]["server"]["launch"] = None  # as `perfdiag run --target URL` records
    (copy / "manifest.json").write_text(json.dumps(manifest))
    f = run_triage(TriageContext(load_run(copy))).by_check("not-reproducible")
    assert f.title == "The run does not record: server launch arguments"
    assert "settings are unknown" in f.explanation
    assert any("--launch" in r for r in f.recommendations)
