"""`perfdiag serve` in its own process, for the tests that drive it over HTTP."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time


def start_server(tmp_path, *extra):
    """`perfdiag serve` on the tiny preset, on an ephemeral port: (process, base URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfdiag", "serve", "--preset", "tiny", "--port", "0",
         "--kv-blocks", "64", "-o", str(tmp_path / "srv"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the server did not start: {line}{proc.stdout.read()}")


def stop_server(proc) -> str:
    """Ctrl-C, as a user stops it; its output."""
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    return out
