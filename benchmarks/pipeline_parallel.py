"""Pipeline parallelism on this machine: the same closed-loop workload in one process, at
--pp 2, --tp 2 and --dp 2, one after the other (interleaved over --rounds); throughput and
latency of each, the pipeline's bubble, transfer share and stage balance, and the
pp-scaling line of `perfdiag compare` against each other layout.

    flock /tmp/perfdiag-cpu.lock .venv/bin/python benchmarks/pipeline_parallel.py \
        [--preset small] [-n 48] [--rounds 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUTS = {"1 proc": [], "PP 2": ["--pp", "2"], "TP 2": ["--tp", "2"], "DP 2": ["--dp", "2"]}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("-n", "--requests", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--extra", default="--closed --concurrency 8 --prompt-len 64 --output-len 32",
                    help="more `perfdiag run` flags, one string")  # fmt: skip
    ap.add_argument("--sweep", default="",
                    help="instead: PP 2 at these micro-batch counts, e.g. 1,2,4, per-stage "
                    "compute and window per step")  # fmt: skip
    a = ap.parse_args()
    if a.sweep:
        return sweep(a)
    out = a.out or Path(tempfile.mkdtemp(prefix="pp-bench-"))
    perfdiag = [sys.executable, "-m", "perfdiag"]
    runs: dict[str, list[Path]] = {k: [] for k in LAYOUTS}
    for r in range(a.rounds):
        for name, flags in LAYOUTS.items():
            path = out / f"{name.replace(' ', '')}-r{r}"
            cmd = [*perfdiag, "run", "--preset", a.preset, "-n", str(a.requests), *flags,
                   "--no-device-sampling", "-q", "--out", str(path), *a.extra.split()]  # fmt: skip
            subprocess.run(cmd, check=True)
            runs[name].append(path)

    from perfdiag import load_run
    from perfdiag.analyzers import pipeline
    from perfdiag.analyzers.serving import analyze_serving

    print(f"machine: {os.cpu_count()} cores ({_cpu_model()}); preset {a.preset}, "
          f"{a.requests} requests, {a.extra}; {a.rounds} rounds interleaved, each shown; "
          f"runs in {out}")  # fmt: skip
    print(f"{'':8}{'tok/s':>8}{'TTFT p50':>10}{'ITL p50':>9}{'E2E p50':>9}{'ms/step':>9}"
          f"{'bubble':>8}{'expect':>8}{'xfer':>7}{'imbal':>7}")  # fmt: skip
    for name, paths in runs.items():
        for path in paths:
            run = load_run(path)
            m = analyze_serving(run).metrics
            st = run.steps
            step_ms = float((st["end_ns"] - st["start_ns"]).mean()) / 1e6
            s = pipeline.summarize(run)
            pp = (f"{s.bubble:>8.0%}{s.expected_bubble:>8.0%}{s.transfer_share:>7.0%}"
                  f"{s.imbalance:>7.0%}") if s else f"{'–':>8}{'–':>8}{'–':>7}{'–':>7}"  # fmt: skip
            print(f"{name:<8}{m.throughput.output_tokens_per_s:>8.1f}"
                  f"{m.ttft_s.p50 * 1e3:>8.0f}ms{m.itl_per_token_s.p50 * 1e3:>7.1f}ms"
                  f"{m.e2e_s.p50:>8.2f}s{step_ms:>9.2f}{pp}")  # fmt: skip
    env = {**os.environ, "COLUMNS": "100"}
    for other in ("1 proc", "TP 2", "DP 2"):
        cmd = [*perfdiag, "compare", str(runs[other][-1]), str(runs["PP 2"][-1])]
        text = subprocess.run(cmd, capture_output=True, text=True, env=env).stdout
        at = text.find("scaling (step 4)")
        print(text[at:].strip() if at >= 0 else f"(compare {other}: no scaling line)")


def sweep(a) -> None:
    """PP 2 at several --pp-microbatches: does overlapping the stages pay on this host?"""
    from perfdiag import load_run
    from perfdiag.analyzers import pipeline
    from perfdiag.analyzers.serving import analyze_serving

    out = a.out or Path(tempfile.mkdtemp(prefix="pp-sweep-"))
    ms = [int(m) for m in a.sweep.split(",")]
    paths = {}
    for r in range(a.rounds):
        for m in ms:
            path = out / f"m{m}-r{r}"
            cmd = [sys.executable, "-m", "perfdiag", "run", "--preset", a.preset, "-n",
                   str(a.requests), "--pp", "2", "--pp-microbatches", str(m),
                   "--no-device-sampling", "-q", "--out", str(path), *a.extra.split()]  # fmt: skip
            subprocess.run(cmd, check=True, capture_output=True)
            paths.setdefault(m, []).append(path)
    print(f"machine: {os.cpu_count()} cores ({_cpu_model()}); preset {a.preset}, PP 2, "
          f"{a.requests} requests, {a.extra}; runs in {out}")  # fmt: skip
    print(f"{'m':>3}{'tok/s':>8}{'E2E p50':>9}{'window':>9}{'stage0':>8}{'stage1':>8}"
          f"{'bubble':>8}{'expect':>8}{'predicted':>11}")  # fmt: skip
    for m, runs in paths.items():
        for path in runs:
            run = load_run(path)
            met = analyze_serving(run).metrics
            s = pipeline.summarize(run)
            n = max(s.steps, 1)
            comp = (s.per_stage["compute_ns"] / n / 1e6).tolist()
            print(f"{m:>3}{met.throughput.output_tokens_per_s:>8.1f}{met.e2e_s.p50:>8.2f}s"
                  f"{s.window_ns / n / 1e6:>7.1f}ms{comp[0]:>6.1f}ms{comp[1]:>6.1f}ms"
                  f"{s.bubble:>8.0%}{s.expected_bubble:>8.0%}"
                  f"{pipeline.predicted_window(s, m) / n / 1e6:>9.1f}ms")  # fmt: skip


if __name__ == "__main__":
    main()
