"""Every command's options given odd values (negative, zero, NaN, huge, text, empty):
each invocation ends in a result (0), one line saying what is wrong (1), or Typer's usage
error (2), never a traceback or a hang."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from fuzz_support import assert_clean, call_cli
from hypothesis import given
from hypothesis import strategies as st

from perfdiag.cli import app

EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"

VALUES = ["-1", "0", "1", "3", "nan", "inf", "-inf", "1e30", str(2**63), "abc", "", "1:2",
          "ttft=0.5", "0.5", "-0.0", "/nonexistent", "x" * 300]  # fmt: skip
# Options that start something long by design (another run, a server, a network target,
# a Ray cluster) or whose value is where output goes; their own checks have their own tests
# (the Ray options': tests/test_ray_import.py, tests/test_ray_load.py).
SKIP = {"--out", "-o", "--target", "--verify-advice", "--verify-out", "--help", "--version",
        "--ray", "--ray-address"}  # fmt: skip
RUN_BASE = ["--preset", "tiny", "-n", "2", "--warmup", "0", "--output-len", "2",
            "--prompt-len", "4", "--no-device-sampling", "-q"]  # fmt: skip


def _options(command: str) -> list[tuple[str, bool]]:
    cmd = typer.main.get_command(app).commands[command]
    out = []
    for p in cmd.params:
        if p.param_type_name != "option" or p.opts[0] in SKIP:
            continue
        out.append((p.opts[0], getattr(p, "is_flag", False) and not p.secondary_opts))
    return out


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
    from perfdiag.probes.session import record_run
    from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

    path = tmp_path_factory.mktemp("cli-fuzz") / "run"
    workload = WorkloadSpec(requests=10, warmup=1, arrival=ArrivalSpec(mode="open", rate=50.0),
                            prompt_len=LengthSpec(value=12),
                            output_len=LengthSpec(value=4))  # fmt: skip
    engine = EngineOptions(preset="tiny", kv_cache_mb=4)
    options = RunOptions(engine, workload, ProbeOptions(device_sampling=False))
    record_run(options, path, command=["pytest"])
    return path


def _fuzz(command, positional, data, tmp_path, monkeypatch, extra=()):
    monkeypatch.chdir(tmp_path)  # anything written by default lands here
    options = _options(command)
    chosen = data.draw(st.lists(st.sampled_from(options), min_size=1, max_size=2, unique=True))
    args = [command, *positional, *extra]
    for name, is_flag in chosen:
        args += [name] if is_flag else [name, data.draw(st.sampled_from(VALUES))]
    outcome = call_cli(*args)
    assert_clean(outcome)


@pytest.mark.parametrize("command", ["inspect", "timeline", "analyze", "export"])
@given(data=st.data())
def test_one_run_commands(sample, tmp_path, monkeypatch, command, data):
    extra = ["-o", str(tmp_path / "out.json")] if command == "export" else []
    _fuzz(command, [str(sample)], data, tmp_path, monkeypatch, extra)


@given(data=st.data())
def test_compare(sample, tmp_path, monkeypatch, data):
    _fuzz("compare", [str(sample), str(sample)], data, tmp_path, monkeypatch)


@given(data=st.data())
def test_run(tmp_path, monkeypatch, data):
    out = tmp_path / f"run-{data.draw(st.integers(0, 10**9))}"
    _fuzz("run", [], data, tmp_path, monkeypatch, [*RUN_BASE, "--out", str(out)])


@given(data=st.data())
def test_import(tmp_path, monkeypatch, data):
    out = tmp_path / f"imported-{data.draw(st.integers(0, 10**9))}"
    _fuzz("import", [str(EXCERPT)], data, tmp_path, monkeypatch, ["-o", str(out)])
