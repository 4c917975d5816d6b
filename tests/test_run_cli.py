"""`perfdiag run` from the command line: bad input, Ctrl-C, and `--like`."""

import json
import signal
import subprocess
import sys
import time

import pytest

from perfdiag import load_run

TINY = ["--preset", "tiny", "--kv-cache-mb", "4", "-q", "--no-device-sampling",
        "--prompt-len", "uniform:8:64", "--output-len", "uniform:4:16"]  # fmt: skip


def _one_line_error(result, *fragments):
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfdiag: error: "), result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--preset", "huge"], ["unknown model preset 'huge'"]),
        (["-w", "no-such-workload"], ["unknown workload 'no-such-workload'"]),
        (["--chunk-size", "0"], ["chunk size must be >= 1"]),
        (["--kv-blocks", "2"], ["KV pool (2 blocks of 16 tokens) cannot hold"]),
        (["--prompt-len", "600"], ["model's context is 512"]),
        (["--prompt-len", "lumpy"], ["bad length"]),
        (["--profile-steps", "9:3"], ["profile steps"]),
        (["--device", "tpu"], ["device 'tpu'"]),
        (["--shared-prefix", "3"], ["GROUPS:LENGTH"]),
    ],
)
def test_bad_input_leaves_nothing_behind(cli, tmp_path, args, fragments):
    out = tmp_path / "run"
    result = cli("run", *TINY, "-n", "3", "--out", out, *args)
    _one_line_error(result, *fragments)
    assert not out.exists()  # nothing half-written left claiming to be a run


def test_unwritable_output_directory(cli):
    # /proc refuses new directories even to root, so this holds for every CI user.
    _one_line_error(cli("run", *TINY, "--out", "/proc/perfdiag/run"), "cannot create")


def test_output_file_in_the_way(cli, tmp_path):
    (tmp_path / "f").write_text("x")
    _one_line_error(cli("run", *TINY, "--out", tmp_path / "f" / "run"), "cannot create")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    _one_line_error(cli("run", *TINY, "--out", tmp_path / "full"), "already exists")


def test_sigint_mid_run_keeps_the_run_and_marks_it_interrupted(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfdiag", "run", *TINY, "-n", "400", "--rate", "20",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the engine has recorded some steps
        streams = list((out / "tables").glob("steps.arrows")) if out.exists() else []
        if streams and streams[0].stat().st_size > 4096:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    run = load_run(out)
    assert run.status == "interrupted"
    assert len(run.steps) > 0 and len(run.request_events) > 0
    assert 0 < len(run.requests) < 400


def test_like_repeats_a_run_with_one_override(cli, tmp_path):
    first = tmp_path / "first"
    result = cli("run", *TINY, "-n", "6", "--seed", "3", "--output-len", "5", "--out", first)
    assert result.returncode == 0, result.stderr
    assert "TTFT" in result.stdout and str(first) in result.stdout
    second = tmp_path / "second"
    result = cli("run", "--like", first, "-q", "--max-seqs", "2", "--out", second)
    assert result.returncode == 0, result.stderr
    a, b = load_run(first).manifest.config, load_run(second).manifest.config
    assert b["run_options"]["engine"]["max_seqs"] == 2
    a["run_options"]["engine"].pop("max_seqs")
    b["run_options"]["engine"].pop("max_seqs")
    assert a["run_options"] == b["run_options"]
    digests = [load_run(p).requests.set_index("request_id")["output_digest"].sort_index()
               for p in (first, second)]  # fmt: skip
    assert (digests[0] == digests[1]).all()  # same workload, greedy: same outputs


def test_a_replay_run_names_its_file(cli, tmp_path):
    replay = tmp_path / "requests.jsonl"
    replay.write_text('{"prompt_tokens": 8, "max_tokens": 3}\n' * 2)
    result = cli("run", *TINY, "--replay", replay, "-n", "2", "--out", tmp_path / "r")
    assert result.returncode == 0, result.stderr
    flat = "".join(result.stdout.split())  # rich may wrap the line anywhere, even mid-path
    assert f"replayof{replay}" in flat  # not the default workload's name


def test_like_refuses_a_run_not_made_by_perfdiag_run(cli, sample_run, tmp_path):
    path, _ = sample_run
    _one_line_error(cli("run", "--like", path, "--out", tmp_path / "x"), "not a run recorded")


def test_run_help_groups_options(cli):
    result = cli("run", "--help")
    assert result.returncode == 0
    for panel in ("Engine", "Workload", "Probes"):
        assert panel in result.stdout
    json.dumps(result.stdout)
