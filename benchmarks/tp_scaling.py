"""Tensor parallelism on this machine: the same workload at --tp 1 and --tp 2, one after the
other in one invocation; tokens/s, comm share, the per-collective cost, and the triage's
explanation (the tp-scaling check of `perfdiag compare`).

    .venv/bin/python benchmarks/tp_scaling.py [--preset small] [-n 40] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("-n", "--requests", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--extra",
        default="--closed --concurrency 8",
        help="more `perfdiag run` flags, one string [closed loop, 8 clients]",
    )
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="tp-scaling-"))
    perfdiag = [sys.executable, "-m", "perfdiag"]
    runs = {}
    for tp in (1, 2):
        path = out / f"tp{tp}"
        cmd = [*perfdiag, "run", "--preset", a.preset, "-n", str(a.requests), "--tp", str(tp),
               "-q", "--out", str(path), *a.extra.split()]  # fmt: skip
        subprocess.run(cmd, check=True)
        runs[tp] = path

    from perfdiag import load_run
    from perfdiag.analyzers import collectives
    from perfdiag.analyzers.serving import analyze_serving

    print(
        f"machine: {os.cpu_count()} cores; preset {a.preset}, {a.requests} requests; runs in {out}"
    )
    print(f"{'':6}{'tokens/s':>10}{'steps':>8}{'ms/step':>9}{'comm share':>12}"
          f"{'coll/step':>11}{'coll µs':>9}{'transfer µs':>13}{'wait share':>12}")  # fmt: skip
    for tp, path in runs.items():
        run = load_run(path)
        m = analyze_serving(run).metrics
        s = collectives.summarize(run)
        st = run.steps
        step_ms = float((st["end_ns"] - st["start_ns"]).mean()) / 1e6
        tps = m.throughput.output_tokens_per_s
        if s is None:
            print(f"TP {tp:<3}{tps:>10.1f}{len(st):>8}{step_ms:>9.2f}{0:>12.0%}{0:>11}{'–':>9}"
                  f"{'–':>13}{'–':>12}")  # fmt: skip
        else:
            print(f"TP {tp:<3}{tps:>10.1f}{len(st):>8}{step_ms:>9.2f}{s.comm_share:>12.0%}"
                  f"{s.collectives_per_step:>11.0f}{s.all_reduce_us:>9.0f}"
                  f"{s.all_reduce_transfer_us:>13.0f}{s.wait_share:>12.0%}")  # fmt: skip
    env = {**os.environ, "COLUMNS": "100"}
    cmd = [*perfdiag, "compare", str(runs[1]), str(runs[2])]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = res.stdout
    at = text.find("scaling (step 4)")
    print(text[at:].strip() if at >= 0 else "(compare printed no scaling line)")


if __name__ == "__main__":
    main()
