"""Drive the real `perfdiag tui` in tmux, the way a user over SSH would, and print each
screen as captured (tmux capture-pane): the overview, a finding's evidence, a request's
timeline, back, the resources step, the comparison of two runs, help, quit.

    .venv/bin/python scripts/tui_tmux.py [RUN_A [RUN_B]] [--size 100x32]

Without runs it records two small ones first (`perfdiag run --preset tiny`, the second
with another chunk size). Exits non-zero when a screen does not show what it should.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SESSION = "perfdiag-tui-check"
ROOT = Path(__file__).resolve().parents[1]
PERFDIAG = [sys.executable, "-m", "perfdiag"]


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def screen() -> str:
    try:
        return tmux("capture-pane", "-p", "-t", SESSION)
    except subprocess.CalledProcessError:
        raise SystemExit("tui_tmux: the tmux session ended (the TUI exited)") from None


def wait_for(pattern: str, timeout: float = 60.0) -> str:
    """The screen once `pattern` (a regex) shows on it; fails after `timeout` seconds."""
    end = time.monotonic() + timeout
    last = None
    while True:
        text = screen()
        # shown, and the same as 0.3 s ago: not a capture of a half-drawn screen
        if re.search(pattern, text, re.M) and text == last:
            return text
        if "EXITED" in text and "EXITED" not in pattern:
            show("the TUI exited", text)
            raise SystemExit("tui_tmux: the TUI exited before " + repr(pattern))
        last = text
        if time.monotonic() > end:
            show("timed out waiting for " + pattern, text)
            raise SystemExit(f"tui_tmux: {pattern!r} never showed")
        time.sleep(0.3)


def keys(*names: str, pause: float = 0.4) -> None:
    for name in names:
        tmux("send-keys", "-t", SESSION, name)
        time.sleep(pause)


def show(title: str, text: str) -> None:
    print(f"===== {title} " + "=" * max(0, 60 - len(title)))
    print("\n".join(line.rstrip() for line in text.rstrip("\n").split("\n")))
    print()


def record(out: Path) -> list[Path]:
    common = ["run", "--preset", "tiny", "-n", "40", "--prompt-len", "uniform:8:200",
              "--output-len", "uniform:4:32", "--rate", "20", "--profile-steps", "5:9"]  # fmt: skip
    runs = [out / "a", out / "b"]
    for path, extra in zip(runs, ([], ["--chunk-size", "32"]), strict=True):
        print(f"recording {path} …", flush=True)
        subprocess.run([*PERFDIAG, *common, *extra, "--out", str(path)], check=True,
                       capture_output=True, cwd=ROOT)  # fmt: skip
    return runs


def request_finding(overview: str) -> int | None:
    """The rank of the first warning/critical finding of step 3, else step 2: the
    latency and load checks name the requests that show them most."""
    found = re.findall(r"^\s+(\d+)\s+(?:CRIT|WARN)\s+([23])\s", overview, re.M)
    for step in ("3", "2"):
        for rank, s in found:
            if s == step:
                return int(rank)
    return None


def drive(runs: list[Path], width: int, height: int) -> None:
    command = " ".join(shlex.quote(str(p)) for p in [*PERFDIAG, "tui", *map(str, runs)])
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    tmux("new-session", "-d", "-s", SESSION, "-x", str(width), "-y", str(height),
         f"cd {shlex.quote(str(ROOT))} && {command}; echo EXITED $?; sleep 600")  # fmt: skip
    try:
        show("overview (while the worker analyses)", wait_for(r"perfdiag · "))
        overview = wait_for(r"Findings, ranked")
        show("overview", overview)
        rank = request_finding(overview)
        if rank is None:
            print("no finding of steps 2–3 names requests: opening the top finding instead")
            rank = 1
        keys(*["Down"] * (rank - 1), "Enter")
        finding = wait_for(r"Worst by id|evidence")
        show(f"finding {rank}: its evidence", finding)
        keys("Enter")
        request = wait_for(r"(Steps it ran in|Kernels, copies and ops)")
        show("drilled into the first id (a request's timeline, or a step's kernels)", request)
        keys("Escape", "Escape")
        show("back at the overview", wait_for(r"Findings, ranked"))
        keys("4")
        show("step 4: resources over a window", wait_for(r"Window .* of"))
        keys("Escape")
        if len(runs) == 2:
            keys("c")
            show("comparison of the two runs (steps 6–7)", wait_for(r"end-to-end \(step 7\)", 90))
            keys("Escape")
        keys("?")
        show("help", wait_for(r"perfdiag tui — keys"))
        keys("Escape", "q")
        after = wait_for(r"EXITED \d+", 10)
        if "EXITED 0" not in after:
            show("after q", after)
            raise SystemExit("tui_tmux: the TUI did not exit cleanly")
        print("quit cleanly (exit code 0).")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--size", default="100x32", help="terminal size, WIDTHxHEIGHT")
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.runs or record(Path(tmp))
        drive(runs[:2], width, height)


if __name__ == "__main__":
    main()
