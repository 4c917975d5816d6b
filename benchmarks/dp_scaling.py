"""Data-parallel replicas on this machine: the same workload at --dp 1 and --dp 2, one
after the other in one invocation; tokens/s, each replica's load and busy share, and the
triage's explanation (its top finding and the dp-imbalance check).

    .venv/bin/python benchmarks/dp_scaling.py [--preset small] [-n 48] [--router least-loaded]
                                              [--out DIR]
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
    ap.add_argument("-n", "--requests", type=int, default=48)
    ap.add_argument("--router", default="least-loaded")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--extra",
        default="--closed --concurrency 8 --max-seqs 4",
        help="more `perfdiag run` flags, one string [closed loop, 8 clients, 4 seqs a step]",
    )
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="dp-scaling-"))
    perfdiag = [sys.executable, "-m", "perfdiag"]
    runs = {}
    for dp in (1, 2):
        path = out / f"dp{dp}"
        cmd = [*perfdiag, "run", "--preset", a.preset, "-n", str(a.requests), "--dp", str(dp),
               "--router", a.router, "--no-device-sampling", "-q", "--out", str(path),
               *a.extra.split()]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        runs[dp] = path

    from perfdiag import load_run
    from perfdiag.analyzers.replicas import analyze_replicas
    from perfdiag.playbooks.evaluate import run_triage
    from perfdiag.playbooks.facts import TriageContext, evaluate_fact

    print(f"machine: {os.cpu_count()} cores; preset {a.preset}, {a.requests} requests, "
          f"{a.extra}, router {a.router}; runs in {out}")  # fmt: skip
    print(f"{'':6}{'tokens/s':>10}{'req/s':>8}{'TTFT p50':>10}{'ITL p50':>9}{'steps':>7}"
          f"{'ms/step':>9}")  # fmt: skip
    tps, tops = {}, {}
    for dp, path in runs.items():
        run = load_run(path)
        ctx = TriageContext(run)
        m = ctx.serving.metrics
        st = run.steps
        step_ms = float((st["end_ns"] - st["start_ns"]).mean()) / 1e6
        tps[dp] = m.throughput.output_tokens_per_s
        print(f"DP {dp:<3}{tps[dp]:>10.1f}{m.throughput.requests_per_s:>8.2f}"
              f"{m.ttft_s.p50 * 1e3:>8.1f}ms{m.itl_per_chunk_s.p50 * 1e3:>7.1f}ms{len(st):>7}"
              f"{step_ms:>9.2f}")  # fmt: skip
        tops[dp] = (run_triage(ctx), ctx)
    print(f"speed-up DP 2 / DP 1: {tps[2] / tps[1]:.2f}x")
    # Why not 2x: the replicas share the cores (torch's threads split between them) and
    # take turns at the GIL for their host work, so each replica's step is slower.
    ms = {dp: float((load_run(p).steps.eval("end_ns - start_ns")).mean()) / 1e6
          for dp, p in runs.items()}  # fmt: skip
    threads = (load_run(runs[2]).manifest.extra.get("router") or {}).get(
        "torch_threads_per_replica"
    )
    print(f"a DP 2 step took {ms[2] / ms[1]:.2f}x a DP 1 step ({threads} torch thread(s) per "
          f"replica against {os.cpu_count()}): two replicas step {2 * ms[1] / ms[2]:.2f}x as "
          "often as one")  # fmt: skip
    rep = analyze_replicas(load_run(runs[2]))
    print(f"\nDP 2 per replica (router {rep.router}, max/mean load {rep.imbalance:.2f}):")
    print(f"{'replica':>8}{'requests':>10}{'tokens':>9}{'busy':>7}{'queue ms':>10}"
          f"{'TTFT p50':>10}{'ITL p50':>9}")  # fmt: skip
    for r in rep.per_replica.itertuples():
        print(f"{r.replica:>8}{r.requests:>10}{r.load_share:>9.0%}{r.busy_share:>7.0%}"
              f"{r.queue_mean_s * 1e3:>10.1f}{r.ttft_p50_s * 1e3:>8.1f}ms"
              f"{r.itl_p50_s * 1e3:>7.1f}ms")  # fmt: skip
    for dp, (triage, _ctx) in tops.items():
        top = triage.top
        print(f"\nDP {dp} triage top: " + (f"{top.severity} {top.check}: {top.title}" if top
                                          else "nothing in steps 2-7"))  # fmt: skip
        for f in triage.findings:
            if f.severity != "info" and f is not top and f.step >= 2:
                print(f"  also {f.severity} {f.check}: {f.title}")
    imb = evaluate_fact("dp_imbalance", tops[2][1], {})
    if hasattr(imb, "value"):
        print(f"\ndp-imbalance on DP 2: {imb.value:.1%} of the run on work beyond an even share")


if __name__ == "__main__":
    main()
