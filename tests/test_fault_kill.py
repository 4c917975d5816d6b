"""`perfdiag run` killed with SIGKILL at moments spread over its life (start-up, inside a
profiler window, mid-run, while compacting): whatever the moment, what is left is either
nothing (killed before the run existed) or a run every command can read."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from fuzz_support import assert_clean, call_cli

from perfdiag import load_run

ARGS = ["run", "--preset", "tiny", "-n", "60", "--warmup", "0", "--output-len", "16",
        "--prompt-len", "16", "-c", "4", "--closed", "--no-device-sampling", "-q",
        "--profile-steps", "5:30"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.3, 2.0, 4.0, 6.0, 8.0])
def test_sigkill_at_any_moment_leaves_a_readable_run_or_nothing(tmp_path, delay_s):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "perfdiag", *ARGS, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(delay_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    if not (out / "manifest.json").exists():
        return  # killed before the run was opened: nothing claims to be a run
    run = load_run(out)
    assert run.status in ("crashed", "complete")
    for name in run.sources:
        run.table(name)  # every table reads
    for args in (("inspect", out), ("timeline", out, "--json"), ("analyze", out, "--no-report")):
        assert_clean(call_cli(*args))
