"""The commands as a user runs them: `perfdiag serve` in its own process (an ephemeral port),
`perfdiag run --target` against it, `perfdiag join`, and `perfdiag analyze` of the server's
run; SIGINT stops the server cleanly and completes its run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from serve_support import start_server as _start_server
from serve_support import stop_server as _stop

from perfdiag.traces.reader import load_run


def test_serve_run_join_analyze(tmp_path, cli):
    proc, url = _start_server(tmp_path, "--api-key", "k1")
    try:
        env = {**os.environ, "PERFDIAG_API_KEY": "k1"}
        r = subprocess.run(
            [sys.executable, "-m", "perfdiag", "run", "--target", url, "-n", "12", "--rate", "40",
             "--prompt-len", "24", "--output-len", "6", "--warmup", "0", "-q",
             "-o", str(tmp_path / "cli")],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        assert "requests (completed / failed / cancelled)" in r.stdout
        unauthorised = cli("run", "--target", url, "-n", "2", "-q", "-o", tmp_path / "nokey")
        assert unauthorised.returncode == 1 and "401" in unauthorised.stderr
        assert not (tmp_path / "nokey").exists()  # nothing half-made left behind
    finally:
        tail = _stop(proc)
    assert proc.returncode == 0, tail
    server = load_run(tmp_path / "srv")
    assert server.status == "complete"
    client = load_run(tmp_path / "cli")
    assert (client.requests["finish_reason"] == "length").all() and len(client.requests) == 12
    joined = cli("join", tmp_path / "cli", tmp_path / "srv", "--json")
    assert joined.returncode == 0, joined.stderr
    payload = json.loads(joined.stdout)
    assert payload["matched"] == 12 and payload["clock"]["samples"] == 12
    parts = {row["part"]: row for row in payload["summary"]}
    assert abs(sum(parts[p]["share"] for p in parts if p != "total_s") - 1.0) < 1e-6
    analyzed = cli("analyze", tmp_path / "srv", "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    assert json.loads(analyzed.stdout)["basis"] == "engine"  # server-side: engine timestamps


def test_run_target_unreachable_is_one_line(tmp_path, cli):
    r = cli("run", "--target", "http://127.0.0.1:9", "-n", "2", "-q", "-o", tmp_path / "x")
    assert r.returncode == 1 and r.stderr.startswith("perfdiag: error: cannot reach")
    assert "Traceback" not in r.stderr


def test_serve_on_a_taken_port_is_one_line_and_leaves_no_run(tmp_path, cli):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("serve", "--preset", "tiny", "--port", port, "-o", tmp_path / "srv", timeout=120)
    assert r.returncode == 1 and "cannot listen on 127.0.0.1" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "srv").exists()
