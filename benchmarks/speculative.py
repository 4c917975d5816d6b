"""Speculative decoding on this CPU (issue 38): SmolLM2-135M without speculation, with the
n-gram proposer and with its own Q4_1 copy as the draft, at K = 2, 4, 8; the same greedy
workload each time. Per configuration: acceptance (accepted / drafted) and the model's α
(per position), tokens per target forward, tokens/s, the speedup measured against the
run without speculation, and the speedup predicted from α, K and the measured cost ratio
c (Leviathan et al.: E = (1 − α^(K+1)) / (1 − α); speedup = E / (1 + K·c), c = one
draft position's time over one plain target step), beside the prediction that also
prices the verify forward's extra cost (analyzers/speculative.py). Greedy outputs are
compared with the run without speculation, request by request.

Runs `perfdiag run` once per configuration and round (a fresh process each; rounds
interleaved, the run without speculation first and last in each), then reads the runs;
with several rounds each configuration's figures are those of its fastest round (a
co-tenant only slows a run down). Run it alone on the machine:

    flock /tmp/perfdiag-cpu.lock .venv/bin/python benchmarks/speculative.py [-n 9]
        [--output-len 64] [--ks 2,4,8] [--methods off,ngram,draft] [--rounds 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DRAFT = "smollm2-135m"  # the file's own Q4_1 blocks, drafting for the float model


def record(out: Path, spec: str | None, a) -> tuple[Path, float]:
    cmd = [sys.executable, "-m", "perfdiag", "run", "--preset", "smollm2-135m",
           "-w", "chat-real", "-n", str(a.requests), "--warmup", "1", "-c", str(a.concurrency),
           "--closed", "--output-len", str(a.output_len), "--no-device-sampling", "-q",
           "--out", str(out)]  # fmt: skip
    if spec:
        cmd += ["--speculative", spec]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out, time.perf_counter() - t0


def outputs(run) -> dict:
    r = run.requests
    return dict(zip(r["request_id"].astype(str), r["output_digest"], strict=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", "--requests", type=int, default=9, help="including 1 warm-up [9]")
    ap.add_argument("-c", "--concurrency", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--methods", default="off,ngram,draft")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="speculative-"))
    ks = [int(k) for k in a.ks.split(",")]
    methods = a.methods.split(",")
    plan: list[tuple[str, str | None]] = [("off", None)]
    for m in ("ngram", "draft"):
        if m in methods:
            plan += [(f"{m} K={k}", f"ngram:{k}" if m == "ngram" else f"draft:{DRAFT}:{k}")
                     for k in ks]  # fmt: skip
    plan.append(("off again", None))  # the machine's drift over the benchmark
    paths: dict[str, list[Path]] = {name: [] for name, _ in plan}
    for r in range(a.rounds):
        for name, spec in plan:
            path = out / f"{name.replace(' ', '_').replace('=', '')}-{r}"
            _, wall = record(path, spec, a)
            paths[name].append(path)
            print(f"round {r}: recorded {name:<10} in {wall:6.1f} s", file=sys.stderr)

    import torch

    from perfdiag import load_run
    from perfdiag.analyzers.serving import analyze_serving
    from perfdiag.analyzers.speculative import summarize

    def fastest(name: str):
        runs = [load_run(p) for p in paths[name]]
        tps = [analyze_serving(x).metrics.throughput.output_tokens_per_s for x in runs]
        best = max(range(len(runs)), key=tps.__getitem__)
        return runs[best], tps[best], tps

    with open("/proc/cpuinfo") as fh:
        cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")),
                   platform.processor() or platform.machine())  # fmt: skip
    print(f"machine: {cpu}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; Python {platform.python_version()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} torch threads")  # fmt: skip
    print(f"SmolLM2-135M float32 target; draft: its Q4_1 blocks; workload chat-real, "
          f"{a.requests} requests (1 warm-up), {a.concurrency} clients closed loop, greedy, "
          f"<= {a.output_len} output tokens (EOS ends); {a.rounds} round(s), the fastest "
          f"shown; runs in {out}")  # fmt: skip
    base, base_tps, _ = fastest("off")
    base_out = outputs(base)
    head = (f"{'':12}{'accept':>7}{'alpha':>7}{'tok/fwd':>8}{'tok/s':>7}{'speedup':>8}"
            f"{'c':>7}{'v':>6}{'Leviathan':>10}{'w/ verify':>10}{'best K':>7}"
            f"{'draft ms':>9}{'verify ms':>10}{'plain ms':>9}{'same out':>9}")  # fmt: skip
    print(head)
    every = {}
    for name in paths:
        run, tps, every[name] = fastest(name)
        mine = outputs(run)
        same = sum(mine.get(rid) == d for rid, d in base_out.items())
        if name.startswith("off"):
            print(f"{name:<12}{'':29}{tps:>7.1f}{tps / base_tps:>7.2f}x{'':82}"
                  f"{same:>5}/{len(base_out)}")  # fmt: skip
            continue
        s = summarize(run, baseline=base, baseline_tokens_per_s=base_tps, tokens_per_s=tps)
        best = "" if s.best_k is None else str(s.best_k)
        print(f"{name:<12}{s.acceptance:>7.2f}{s.alpha:>7.2f}{s.tokens_per_forward:>8.2f}"
              f"{tps:>7.1f}{s.measured_speedup:>7.2f}x{s.c:>7.3f}{s.v:>6.2f}"
              f"{s.leviathan_speedup:>9.2f}x{s.predicted_speedup:>9.2f}x{best:>7}"
              f"{s.draft_ms:>9.1f}{s.verify_ms:>10.1f}{s.plain_forward_ms:>9.1f}"
              f"{same:>5}/{len(base_out)}")  # fmt: skip
    if a.rounds > 1:
        print(
            "tokens/s of every round: "
            + "; ".join(
                f"{name} " + ", ".join(f"{t:.1f}" for t in tps) for name, tps in every.items()
            )
        )


if __name__ == "__main__":
    main()
