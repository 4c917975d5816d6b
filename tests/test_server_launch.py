"""`perfdiag run --launch`: a server started under perfdiag in its own process group,
driven, stopped, its log kept in the run; a server that exits, hangs or is not found is
one line and leaves nothing running. The servers: `perfdiag serve --preset tiny` and a
small vLLM look-alike (aiohttp, starts in a blink: /health, /version, /v1/models with
`owned_by: vllm`, /metrics with `vllm:cache_config_info`, streamed completions)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from perfdiag.errors import ConfigError
from perfdiag.probes import server_launch
from perfdiag.probes.run_options import RunOptions
from perfdiag.probes.server_args import parse_server_args, server_kind
from perfdiag.probes.server_launch import (
    LaunchSpec,
    ServerStartError,
    launch,
    telling_line,
    with_port,
)
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec
from perfdiag.traces.reader import load_run

PY = shlex.quote(sys.executable)

FAKE_VLLM = Path(__file__).parent / "fake_vllm.py"  # a vLLM look-alike


@pytest.fixture
def fake_vllm(tmp_path):
    return f"{PY} {shlex.quote(str(FAKE_VLLM))}"


def _options(n: int = 4, output: int = 4) -> RunOptions:
    spec = WorkloadSpec(requests=n, warmup=0,
                        arrival=ArrivalSpec(mode="closed", concurrency=2),
                        prompt_len=LengthSpec(value=6),
                        output_len=LengthSpec(value=output))  # fmt: skip
    return RunOptions(workload=spec)


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def started(monkeypatch):
    """Every process `launch` starts (to check its group is gone afterwards)."""
    procs: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen(*args, **kw):
        proc = real(*args, **kw)
        if kw.get("start_new_session"):  # the server (not git, asked for the fingerprint)
            procs.append(proc)
        return proc

    monkeypatch.setattr(server_launch.subprocess, "Popen", popen)
    return procs


# ---- the command line as data -----------------------------------------------------------
def test_parse_vllm_style_arguments():
    argv = shlex.split("vllm serve /m --max-num-seqs 2 --no-enable-prefix-caching "
                       "--max-num-batched-tokens=64 --enforce-eager --gpu-memory-utilization 0.9 "
                       "--seed -1 --compilation-config '{\"level\": 3}'")  # fmt: skip
    assert parse_server_args(argv) == {
        "model": "/m",
        "max_num_seqs": 2,
        "enable_prefix_caching": False,
        "max_num_batched_tokens": 64,
        "enforce_eager": True,
        "gpu_memory_utilization": 0.9,
        "seed": -1,
        "compilation_config": {"level": 3},
    }
    python = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
              "--enable-prefix-caching", "--port=8001"]  # fmt: skip
    assert parse_server_args(python) == {"model": "m", "enable_prefix_caching": True, "port": 8001}
    assert parse_server_args(["llama-server", "-m", "x.gguf", "-np", "4", "-c", "2048"]) == {
        "m": "x.gguf", "np": 4, "c": 2048}  # fmt: skip


@pytest.mark.parametrize(("command", "kind"), [
    ("vllm serve m", "vllm"), ("/opt/venv/bin/vllm serve m", "vllm"),
    ("python -m vllm.entrypoints.openai.api_server --model m", "vllm"),
    ("python3.12 -m sglang.launch_server --model-path m", "sglang"), ("sglang serve", "sglang"),
    ("llama-server -m x.gguf", "llamacpp"), ("perfdiag serve --preset tiny", "perfdiag"),
    (f"{sys.executable} -m perfdiag serve", "perfdiag"), ("./my_server --port 1", "unknown"),
])  # fmt: skip
def test_server_kind(command, kind):
    assert server_kind(shlex.split(command)) == kind


def test_port_from_the_command_or_a_free_one():
    assert with_port(["s", "--port", "8123"]) == (["s", "--port", "8123"], 8123)
    assert with_port(["s", "--port=8124", "-x"]) == (["s", "--port=8124", "-x"], 8124)
    argv, port = with_port(["s", "--port", "0", "-x"])
    assert argv == ["s", "-x", "--port", str(port)] and port > 0
    argv, port = with_port(["s"])
    assert argv == ["s", "--port", str(port)]
    with pytest.raises(ConfigError, match="not a number"):
        with_port(["s", "--port", "eighty"])


def test_leading_assignments_are_the_environment():
    spec = LaunchSpec("CUDA_VISIBLE_DEVICES=1 A=b vllm serve m", env={"X": 1})
    assert spec.argv == ["vllm", "serve", "m"]
    assert spec.extra_env == {"X": "1", "CUDA_VISIBLE_DEVICES": "1", "A": "b"}
    with pytest.raises(ConfigError, match="needs a server command"):
        LaunchSpec("  ")
    with pytest.raises(ConfigError, match="cannot read"):
        LaunchSpec("vllm serve 'm")


def test_telling_line(tmp_path):
    log = tmp_path / "log"
    log.write_text("INFO loading\nTraceback (most recent call last):\n  File x\n"
                   "ValueError: bad value for --max-num-seqs\nINFO shutting down\n\n")  # fmt: skip
    assert telling_line(log) == "ValueError: bad value for --max-num-seqs"
    log.write_text("\x1b[32mINFO\x1b[0m ready\n" + "x" * 500 + "\n")
    assert telling_line(log) == "x" * 199 + "…"
    assert telling_line(tmp_path / "missing") == ""


# ---- launching ---------------------------------------------------------------------------
def test_launch_drive_stop_a_vllm_look_alike(tmp_path, fake_vllm):
    from perfdiag.probes.http_session import HttpOptions, record_http_run

    spec = LaunchSpec(f"{fake_vllm} --max-num-seqs 2", env={"FAKE_FLAG": "1"})
    seen = []
    result = record_http_run(
        _options(), tmp_path / "run", http=HttpOptions(launch=spec), on_launched=seen.append
    )
    assert result.status == "complete"
    run = load_run(tmp_path / "run")
    server = run.manifest.config["server"]
    assert server["kind"] == "vllm"  # its /v1/models says so (the command is `python x.py`)
    assert server["version"] == "0.0.fake"
    assert server["models"] == [{"id": "m", "owned_by": "vllm", "max_model_len": 512}]
    assert server["info"]["vllm:cache_config_info"]["num_gpu_blocks"] == "364"
    launched = server["launch"]
    assert launched["args"]["max_num_seqs"] == 2 and launched["env"] == {"FAKE_FLAG": "1"}
    assert launched["argv"][-2] == "--port" and launched["log"] == "server/server.log"
    assert launched["exit_code"] == 0 and launched["startup_s"] > 0  # SIGTERM: a clean exit
    assert "fake vLLM starting" in (tmp_path / "run" / "server" / "server.log").read_text()
    assert len(run.requests) == 4 and (run.requests["finish_reason"] == "length").all()
    assert _gone(seen[0].pgid)
    assert not list(tmp_path.glob(".run.server-*"))  # the log's first folder is gone


def test_launch_perfdiag_serve_end_to_end(tmp_path, started):
    from perfdiag.probes.http_session import HttpOptions, record_http_run

    command = f"{PY} -m perfdiag serve --preset tiny --kv-blocks 64 --max-seqs 2 --no-record"
    result = record_http_run(
        _options(), tmp_path / "run", http=HttpOptions(launch=LaunchSpec(command))
    )
    assert result.status == "complete"
    run = load_run(tmp_path / "run")
    config = run.manifest.config
    assert "engine" not in config["run_options"] and "probes" not in config["run_options"]
    assert config["run_options"]["workload"]["requests"] == 4
    server = config["server"]
    assert server["kind"] == "perfdiag" and server["version"] is None
    assert server["models"][0]["owned_by"] == "perfdiag"
    assert server["launch"]["argv"][:4] == [sys.executable, "-m", "perfdiag", "serve"]
    assert server["launch"]["args"]["max_seqs"] == 2 and server["launch"]["exit_code"] == 0
    assert (tmp_path / "run" / "server" / "server.log").stat().st_size > 0
    assert len(run.requests) == 4
    assert [_gone(p.pid) for p in started] == [True]
    # --like of a target run: no engine section recorded, the engine's defaults
    from perfdiag.probes.run_flag_options import like_options

    like = like_options(tmp_path / "run")
    assert like.workload.requests == 4 and like.engine == RunOptions().engine


def test_a_server_that_exits_at_once(tmp_path, started):
    from perfdiag.probes.http_session import HttpOptions, record_http_run

    code = "import sys; print('INFO parsing'); print('Error: bad flag'); sys.exit(2)"
    command = f"{PY} -c {shlex.quote(code)}"
    with pytest.raises(ServerStartError) as e:
        record_http_run(_options(), tmp_path / "run", http=HttpOptions(launch=LaunchSpec(command)))
    message = str(e.value)
    assert "exited with code 2" in message and "Error: bad flag" in message
    assert "\n" not in message
    assert not (tmp_path / "run").exists() and not list(tmp_path.iterdir())  # no half-made run
    kept = e.value.log_path  # the whole log is kept aside, named in the message
    assert str(kept) in message and "bad flag" in kept.read_text()
    shutil.rmtree(kept.parent)
    assert all(_gone(p.pid) for p in started) and len(started) == 1


def test_a_server_never_healthy_times_out(tmp_path, started):
    command = f"{PY} -c \"import time; print('loading weights', flush=True); time.sleep(60)\""
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match=r"not healthy after 2 s") as e:
        launch(LaunchSpec(command, startup_timeout_s=2), tmp_path / "server" / "server.log")
    assert time.monotonic() - t0 < 15
    assert "loading weights" in str(e.value) and str(tmp_path / "server") in str(e.value)
    assert all(_gone(p.pid) for p in started) and len(started) == 1


def test_ctrl_c_while_waiting_stops_the_server(tmp_path, started):
    command = f'{PY} -c "import time; time.sleep(60)"'
    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        launch(LaunchSpec(command, startup_timeout_s=30), tmp_path / "server.log")
    assert all(_gone(p.pid) for p in started) and len(started) == 1


def test_stop_kills_a_group_that_ignores_sigterm(tmp_path):
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    command = f"{PY} -c {shlex.quote(ignore)}"
    proc = subprocess.Popen(shlex.split(command), start_new_session=True)
    server = server_launch.LaunchedServer(proc, [], "http://127.0.0.1:1", tmp_path / "log")
    time.sleep(0.3)  # its handler is set
    assert server.stop(grace_s=0.5) == -signal.SIGKILL
    assert server.stop() == -signal.SIGKILL  # idempotent
    assert _gone(proc.pid)


def test_stop_ends_the_whole_group_not_only_its_leader(tmp_path):
    """A worker that ignores SIGTERM outlives its leader: it is killed all the same."""
    worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    leader = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
              f"{worker!r}]); time.sleep(60)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", leader], start_new_session=True)
    server = server_launch.LaunchedServer(proc, [], "http://127.0.0.1:1", tmp_path / "log")
    deadline = time.monotonic() + 10
    while server_launch._live_members(proc.pid) != 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_launch._live_members(proc.pid) == 2
    time.sleep(0.2)  # the worker's handler is set
    t0 = time.monotonic()
    assert server.stop(grace_s=0.5) == -signal.SIGTERM  # the leader ended on SIGTERM
    assert time.monotonic() - t0 < 5
    assert _gone(proc.pid) or server_launch._live_members(proc.pid) == 0


def test_command_not_found_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^server command not found: no-such-server-xyz$"):
        launch(LaunchSpec("no-such-server-xyz --flag"), tmp_path / "server.log")


# ---- the CLI -----------------------------------------------------------------------------
def test_cli_launch_and_target_are_exclusive(tmp_path, cli):
    r = cli("run", "--launch", "vllm serve m", "--target", "http://127.0.0.1:1", "-n", "2",
            "-q", "-o", tmp_path / "x")  # fmt: skip
    assert r.returncode == 1 and "mutually exclusive" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_cli_sigterm_stops_the_launched_server(tmp_path, fake_vllm):
    """perfdiag stopped by SIGTERM mid-run: the run is kept (interrupted) with the server's
    log, and the server's process group is gone."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfdiag", "run", "--launch", f"{fake_vllm} --token-delay 0.2",
         "-n", "50", "--prompt-len", "6", "--output-len", "20", "--warmup", "0", "-q",
         "-o", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "server healthy at" in line:
                break
        assert re.search(r"after \d+\.\d s \(pid \d+\)", lines[-1]), "".join(lines)
        pid = int(re.search(r"pid (\d+)", lines[-1]).group(1))
        time.sleep(1.0)  # mid-run
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, "".join(lines) + rest
    assert "launching `" in lines[0]
    assert _gone(pid)
    run = load_run(tmp_path / "run")
    assert run.status == "interrupted"
    assert run.manifest.config["server"]["launch"]["exit_code"] == 0
    assert "fake vLLM starting" in (tmp_path / "run" / "server" / "server.log").read_text()


def test_the_telling_line_is_the_root_cause_not_its_wrapper(tmp_path):
    """vLLM's engine core failing at start (a KV cache too small for --max-model-len)."""
    from perfdiag.probes.server_launch import telling_line

    log = tmp_path / "server.log"
    log.write_text(
        "(EngineCore pid=5) ERROR [core.py:1510] EngineCore failed to start.\n"
        "ValueError: To serve at least one request with the model's max seq len (2048), "
        "0.04 GiB KV cache is needed\n"
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}\n"
        "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: leaked\n"
    )
    assert telling_line(log).startswith("ValueError: To serve at least one request")


@pytest.mark.parametrize(("period", "scrape"), [(None, 0.5), (0.0, None), (2.0, 2.0)])
def test_metrics_period_sets_the_scrape(period, scrape):
    from perfdiag.cli.run import build_options

    _, http = build_options({"target": "http://127.0.0.1:8000", "metrics_period": period})
    assert http.scrape_period_s == scrape


def test_metrics_period_needs_a_server():
    from perfdiag.cli.run import build_options

    with pytest.raises(ConfigError, match="needs --target or --launch"):
        build_options({"metrics_period": 1.0})
