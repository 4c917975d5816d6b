"""`perfdiag run --launch "vllm serve …" --server-profile START:END`: vLLM's profiler over a
window of the workload, its traces moved into the run and imported (server/trace), the
window's instants and the trace's alignment in the manifest; the CLI's one-line refusals.

The server is a vLLM look-alike named `vllm` (so the command reads as vLLM's): with
`--profiler-config` it answers /start_profile and /stop_profile, "steps" every 20 ms
while profiling, and writes a small Kineto trace per worker (after /stop_profile
answered, in two parts, as a slow writer would) and the front end's own, as vLLM names
them."""

from __future__ import annotations

import gzip
import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from perfdiag.errors import ConfigError
from perfdiag.probes.http_session import HttpOptions, record_http_run
from perfdiag.probes.run_options import RunOptions
from perfdiag.probes.server_launch import LaunchSpec
from perfdiag.probes.server_profile import (
    FLAG,
    Call,
    ServerProfiler,
    ServerProfileSpec,
    check_launch,
    expected_workers,
    without_flag,
)
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec
from perfdiag.traces.manifest import COMPLETE
from perfdiag.traces.reader import load_run

DATA = Path(__file__).parent / "data" / "vllm" / "profile"
FAKE_VLLM = Path(__file__).parent / "fake_vllm.py"


def fake_vllm_cmd(tmp_path) -> str:
    """The look-alike's command line: an executable named vllm (`vllm serve m`)."""
    exe = tmp_path / "bin" / "vllm"
    if not exe.exists():
        exe.parent.mkdir(exist_ok=True)
        exe.write_text(f"#!{sys.executable}\nimport runpy\n"
                       f"runpy.run_path({str(FAKE_VLLM)!r}, run_name='__main__')\n")  # fmt: skip
        exe.chmod(0o755)
    return f"{shlex.quote(str(exe))} serve m"


def _options(n: int = 6, output: int = 10) -> RunOptions:
    spec = WorkloadSpec(requests=n, warmup=0,
                        arrival=ArrivalSpec(mode="closed", concurrency=2),
                        prompt_len=LengthSpec(value=6),
                        output_len=LengthSpec(value=output))  # fmt: skip
    return RunOptions(workload=spec)


def _record(where, command: str, window: str, env=None, n: int = 6):
    http = HttpOptions(launch=LaunchSpec(command, env=env or {}),
                       server_profile=ServerProfileSpec.parse(window))  # fmt: skip
    result = record_http_run(_options(n), where / "run", http=http)
    return result, load_run(result.path)


def _leftovers(where) -> list[str]:
    return [p.name for p in where.iterdir() if p.name.startswith(".run.")]


def test_a_window_is_profiled_kept_and_imported(tmp_path, cli):
    """START 0.3 s, END 0.9 s into a ~1.5 s workload: /start_profile and /stop_profile at
    those instants, the traces (written after /stop_profile answered) waited for, moved
    into server/profile, the worker's imported as server/trace, the front end's apart."""
    result, run = _record(tmp_path, f"{fake_vllm_cmd(tmp_path)} --token-delay 0.05", "0.3:0.9")
    assert run.status == COMPLETE
    server = run.manifest.config["server"]
    prof = server["profile"]
    assert prof["warnings"] == []
    assert prof["window_s"] == [0.3, 0.9]
    start, stop = prof["window_ns"]
    t0 = prof["workload_start_ns"]
    assert 0.3e9 <= start - t0 < 0.5e9
    assert prof["calls"]["/stop_profile"]["sent_ns"] - t0 >= 0.9e9
    assert 0.5e9 < stop - start < 1.0e9
    assert prof["wall_ns"][1] - prof["wall_ns"][0] == pytest.approx(stop - start, abs=5e6)
    assert {c["status"] for c in prof["calls"].values()} == {200}
    assert prof["dir"] == "server/profile" and prof["trace_run"] == "server/trace"
    assert prof["frontend_run"] == "server/trace-frontend"
    names = prof["files"]  # the traces gzipped once the server stopped
    assert len(names) == 3 and sum(".async_llm." in n for n in names) == 1
    assert sum(n.endswith(".pt.trace.json.gz") for n in names) == 2
    assert sum(n.endswith(".profiler_out.txt") for n in names) == 1
    assert sorted(p.name for p in (result.path / "server/profile").iterdir()) == names
    # launch.argv is the user's command (a relaunch starts it); the flag is said apart
    launched = server["launch"]
    assert FLAG not in launched["argv"] and "profiler_config" not in launched["args"]
    assert prof["launch_flag"][0] == FLAG
    assert json.loads(prof["launch_flag"][1])["profiler"] == "torch"
    trace = load_run(result.path / "server/trace")
    steps = trace.spans[trace.spans["name"].str.startswith("execute_context_")]
    assert 10 <= len(steps) <= 40  # a step every ~20 ms for ~0.6 s
    assert len(load_run(result.path / "server/trace-frontend").spans) == 1
    al = prof["alignment"]
    assert al["steps"] == len(steps) and al["inside_window"] is True
    assert al["lead_ns"] >= 0 and al["trail_ns"] >= 0
    # the offset puts the trace's steps on the run's clock, inside the window
    first = int(steps["start_ns"].min()) + al["trace_to_run_ns"]
    assert first == al["steps_ns"][0] and start <= first <= stop
    assert _leftovers(tmp_path) == []  # no staging folder left beside the run

    # perfdiag timeline on the client run shows the server trace's timeline
    r = cli("timeline", result.path, "--no-critical-path")
    assert r.returncode == 0, r.stderr
    first_line = r.stdout.strip().splitlines()[0]
    assert first_line.startswith("vLLM's profiler trace (server/trace): ")
    assert f"{len(steps)} steps" in first_line and "0.3–0.9 s" in first_line
    assert "aten::mm" in r.stdout
    r = cli("timeline", result.path, "--no-critical-path", "--json")
    assert json.loads(r.stdout)["trace_run"] == str(result.path / "server/trace")


def test_two_workers_to_the_workload_end(tmp_path):
    """END left out: /stop_profile when the workload ends; two TP workers, two ranks
    (from the file names); a slow /stop_profile (the engine stands still) is said."""
    command = f"{fake_vllm_cmd(tmp_path)} --token-delay 0.02 --tensor-parallel-size 2"
    result, run = _record(tmp_path, command, "0.2", n=4, env={"FAKE_STOP_S": "1.2"})
    prof = run.manifest.config["server"]["profile"]
    assert prof["window_s"] == [0.2, None]
    assert len(prof["warnings"]) == 1, prof["warnings"]
    assert prof["warnings"][0].startswith("/stop_profile took 1.2 s: vLLM's engine writes")
    last_done = int(run.request_events["ts_ns"].max())  # the window closes after the last
    assert prof["calls"]["/stop_profile"]["sent_ns"] >= last_done
    trace = load_run(result.path / "server/trace")
    assert sorted(trace.spans["rank"].dropna().unique()) == [0, 1]
    assert prof["alignment"]["inside_window"] is True


def test_nothing_profiled_is_a_warning_not_a_failure(tmp_path):
    """A window after the workload's end, or a /start_profile that fails: the run is
    complete, the section says why there is no trace, and no staging folder is left."""
    _, run = _record(tmp_path, fake_vllm_cmd(tmp_path), "30:40", n=2)
    prof = run.manifest.config["server"]["profile"]
    assert run.status == COMPLETE and prof["window_ns"] is None and prof["trace_run"] is None
    assert prof["calls"] == {} and prof["files"] == []
    assert len(prof["warnings"]) == 1 and "before the window's start (30 s)" in prof["warnings"][0]
    assert _leftovers(tmp_path) == []

    (tmp_path / "x").mkdir()
    _, run = _record(tmp_path / "x", fake_vllm_cmd(tmp_path), "0:1",
                     env={"FAKE_PROFILE_FAIL": "1"}, n=2)  # fmt: skip
    prof = run.manifest.config["server"]["profile"]
    assert run.status == COMPLETE and prof["trace_run"] is None
    assert prof["calls"]["/start_profile"]["status"] == 500
    assert prof["warnings"] == ["POST /start_profile failed (status 500: profiler exploded)"]


def test_the_real_traces_are_told_apart_and_put_on_the_runs_clock(tmp_path):
    """vLLM's own file names (tests/data/vllm/profile): the worker's trace imported as
    server/trace, the front end's as server/trace-frontend, never as a second rank; the
    steps' wall times (baseTimeNanoseconds + ts) land where the offset says."""
    real = sorted(DATA.glob("*.pt.trace.json.gz"))
    (tmp_path / "run").mkdir()
    profiler = ServerProfiler(ServerProfileSpec(2.0, 5.0), tmp_path / "run")
    for p in real:
        shutil.copy(p, profiler.staging / p.name)
    worker = json.loads(gzip.decompress(real[0].read_bytes()))
    steps = [e for e in worker["traceEvents"] if e.get("name", "").startswith("execute_context")]
    wall = [worker["baseTimeNanoseconds"] + round(e["ts"] * 1e3) for e in steps]
    clock = {"monotonic_ns": 10**12, "wall_ns": min(wall) - 10**9, "uncertainty_ns": 100}
    mono = [w - clock["wall_ns"] + clock["monotonic_ns"] for w in wall]  # the run's clock
    profiler.calls = {"/start_profile": Call("/start_profile", min(mono) - 10**6, 0, status=200),
                      "/stop_profile": Call("/stop_profile", max(mono), 0, max(mono) + 10**8,
                                            status=200)}  # fmt: skip
    profiler.collect(["perfdiag"], clock)
    rec = profiler.record()
    assert rec["warnings"] == [] and rec["files"] == [p.name for p in real]
    assert rec["trace_run"] == "server/trace" and rec["frontend_run"] == "server/trace-frontend"
    trace = load_run(tmp_path / "run/server/trace")
    assert set(trace.spans["rank"].dropna()) == {0}
    assert rec["alignment"]["steps"] == len(steps) == 3 and rec["alignment"]["inside_window"]
    assert abs(rec["alignment"]["steps_ns"][0] - min(mono)) <= 1_000  # ts is µs with ns digits
    front = load_run(tmp_path / "run/server/trace-frontend")  # on this CPU build: no ops,
    assert len(front.spans) == 0  # only the profiler's own window
    assert len(front.manifest.extra["kineto"]["files"][0]["profiler_windows"]) == 1
    assert _leftovers(tmp_path) == []


# ---- the options -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "window"),
    [("2:5", (2.0, 5.0)), ("2", (2.0, None)), ("2:", (2.0, None)), (":1.5", (0.0, 1.5))],
)
def test_window_parsing(text, window):
    spec = ServerProfileSpec.parse(text)
    assert (spec.start_s, spec.end_s) == window


@pytest.mark.parametrize(
    ("text", "message"),
    [("5:2", "END must be after START"), ("a:b", "bad --server-profile 'a:b'"),
     ("-1:2", "START must be >= 0"), ("nan", "START must be >= 0"), ("1:1", "END must be")],
)  # fmt: skip
def test_bad_windows(text, message):
    with pytest.raises(ConfigError, match=message):
        ServerProfileSpec.parse(text)


def test_only_a_launched_vllm():
    with pytest.raises(ConfigError, match="needs --launch"):
        check_launch(None)
    with pytest.raises(ConfigError, match=r"not vLLM's \(`llama-server`: llamacpp\)"):
        check_launch(LaunchSpec("llama-server -m x.gguf"))
    with pytest.raises(ConfigError, match="sets vLLM's --profiler-config itself"):
        check_launch(LaunchSpec('vllm serve m --profiler-config \'{"profiler": "torch"}\''))
    with pytest.raises(ConfigError, match="sets vLLM's --profiler-config itself"):
        check_launch(LaunchSpec("vllm serve m --profiler-config.profiler=torch"))
    check_launch(LaunchSpec("VLLM_X=1 python3 -m vllm.entrypoints.openai.api_server --model m"))
    with pytest.raises(ConfigError, match="needs --launch"):
        HttpOptions(url="http://127.0.0.1:1", server_profile=ServerProfileSpec(1.0))


def test_launch_flag_helpers():
    argv = ["vllm", "serve", "m", FLAG, '{"a":1}', "--port", "8000"]
    assert without_flag(argv) == ["vllm", "serve", "m", "--port", "8000"]
    assert expected_workers(["vllm", "serve", "m", "--tensor-parallel-size", "2", "-pp", "2"]) == 4
    assert expected_workers(["vllm", "serve", "m"]) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "http://127.0.0.1:1", "--server-profile", "1:2"], "needs --launch"),
        (["--launch", "llama-server -m x.gguf", "--server-profile", "1:2"], "not vLLM's"),
        (["--launch", "vllm serve m", "--server-profile", "5:2"], "END must be after START"),
        (["--launch", "vllm serve m", "--server-profile", "x"], "bad --server-profile 'x'"),
        (["--server-profile", "1:2"], "needs --launch"),
    ],
)
def test_cli_refusals_are_one_line(tmp_path, cli, args, message):
    r = cli("run", *args, "-n", "2", "-q", "-o", tmp_path / "x")
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
