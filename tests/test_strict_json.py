"""Every command's `--json` output is strict JSON (no NaN, no Infinity), on a recorded
run and on imported traces: read by a parser that refuses what RFC 8259 leaves out."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfdiag.cli.json_output import json_text

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py
EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"
CLI_DIR = Path(__file__).resolve().parents[1] / "cli"
TINY = ["--preset", "tiny", "--kv-cache-mb", "4", "-q", "--no-device-sampling",
        "--prompt-len", "uniform:8:64", "--output-len", "uniform:4:16"]  # fmt: skip
# Commands with --json, and where this file runs them (a guard below keeps it complete).
COVERED = {"analyze", "calibrate", "compare", "doctor", "export", "join", "import", "inspect",
           "timeline"}  # fmt: skip


def strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _ok(result) -> object:
    assert result.returncode == 0, result.stderr
    return strict_loads(result.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A recorded run (profiled steps: spans without kernels), an imported trace with
    kernels, and a real trace without any GPU work."""
    from conftest import run_cli

    from perfdiag.traces.importers.kineto import import_kineto

    tmp = tmp_path_factory.mktemp("strict")
    r = run_cli("run", *TINY, "-n", "3", "--profile-steps", "1:3", "--out", tmp / "recorded")
    assert r.returncode == 0, r.stderr
    import_kineto([EXCERPT], tmp / "imported")
    import_kineto([KINETO / "cpu_only.json.gz"], tmp / "cpu_only")
    return {name: tmp / name for name in ("recorded", "imported", "cpu_only")}


def test_json_text_is_strict():
    data = {
        "nan": float("nan"),
        "inf": [float("inf"), -math.inf],
        "np": np.float64("nan"),
        "na": pd.NA,
        3: {"deep": (np.float32("inf"),)},
        "frame": pd.DataFrame({"a": [np.inf, 1.0]}),
        "array": np.array([np.nan, 2.0]),
    }
    parsed = strict_loads(json_text(data))
    assert parsed == {
        "nan": None, "inf": [None, None], "np": None, "na": None, "3": {"deep": [None]},
        "frame": [{"a": None}, {"a": 1.0}], "array": [None, 2.0],
    }  # fmt: skip


@pytest.mark.parametrize("which", ["recorded", "imported", "cpu_only"])
def test_run_commands_write_strict_json(runs, which, cli, tmp_path):
    run = runs[which]
    timeline = _ok(cli("timeline", run, "--json"))
    assert "kernels_linked" in timeline  # NaN before: a run without kernels
    _ok(cli("analyze", run, "--json", "--no-report"))
    _ok(cli("inspect", run, "--json"))
    _ok(cli("export", run, "-f", "chrome", "-o", tmp_path / "t.json", "--json"))


def test_other_commands_write_strict_json(runs, cli, tmp_path):
    _ok(cli("compare", runs["recorded"], runs["imported"], "--json"))
    _ok(cli("import", EXCERPT, "--out", tmp_path / "again", "--json"))
    _ok(cli("doctor", "--json"))
    cal = ["--seconds", "0.05", "--cpu-only", "--ceilings-dir", tmp_path / "ceilings", "--json"]
    _ok(cli("calibrate", *cal))


def test_join_writes_strict_json(tmp_path, cli):
    from perfdiag.engine_ref import LLMEngine
    from perfdiag.engine_ref.server import ServerConfig, ServerThread
    from perfdiag.engine_ref.testing import tiny_config
    from perfdiag.probes.http_session import HttpOptions, record_http_run
    from perfdiag.probes.run_options import ProbeOptions, RunOptions
    from perfdiag.probes.server_probe import ServerRun
    from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

    engine = LLMEngine(tiny_config())
    config = ServerConfig(port=0)
    server = ServerRun(tmp_path / "srv", engine, config, device_sampling=False)
    with ServerThread(engine, config, server.recorder, server.run_id) as srv:
        spec = WorkloadSpec(requests=4, arrival=ArrivalSpec(mode="open", rate=80.0,
                                                            concurrency=2),
                            prompt_len=LengthSpec(value=16),
                            output_len=LengthSpec(value=4))  # fmt: skip
        options = RunOptions(workload=spec, probes=ProbeOptions(device_sampling=False))
        record_http_run(options, tmp_path / "cli", http=HttpOptions(url=srv.url))
    server.close("complete")
    joined = _ok(cli("join", tmp_path / "cli", tmp_path / "srv", "--json"))
    assert joined["matched"] == 4


def test_every_json_command_is_covered():
    """A command that gains --json must be added above (COVERED)."""
    with_json = set()
    for path in CLI_DIR.glob("*.py"):
        text = path.read_text()
        if '"--json"' not in text:
            continue
        for name, fn in re.findall(r'@app\.command\((?:"([\w-]+)")?[^)]*\)\s*def (\w+)', text):
            with_json.add(name or fn.replace("_", "-"))
    assert with_json <= COVERED, f"--json commands not tested here: {with_json - COVERED}"
    assert {"timeline", "analyze", "import"} <= with_json
