"""A diagnosis scenario of pipeline parallelism recorded at 1 and at M micro-batches per step,
interleaved, the same workload seed each time: E2E p50, the window per step, the
contention factor k (analyzers/pipeline_overlap.py) and each stage's compute per step.
What `--verify-advice` would measure for `--pp-microbatches M`, whether or not pp-bubbles
advises it.

    flock /tmp/perfdiag-cpu.lock .venv/bin/python -m benchmarks.pipeline_microbatch_ab \\
        [SCENARIO] [--m M] [--repeats N] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.diagnosis.scenarios import by_name
from perfdiag import load_run
from perfdiag.analyzers import pipeline as P
from perfdiag.analyzers.serving import analyze_serving


def record(base, m: int, out: Path) -> tuple[float, str]:
    s = dataclasses.replace(base, name=f"{base.name}-m{m}",
                            engine=base.engine | {"pp_microbatches": m})  # fmt: skip
    run = load_run(s.record(out))
    e2e = analyze_serving(run).metrics.e2e_s.p50
    p = P.summarize(run)
    stages = (p.per_stage["compute_ns"] / p.steps / 1e6).round(0).tolist()
    return e2e, (f"E2E p50 {e2e:.3f} s, window {p.window_ns / p.steps / 1e6:.0f} ms/step, "
                 f"k {p.contention.k:.2f} ({p.contention.model}), stage compute {stages} "
                 f"ms/step")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", default="pp-few-microbatches")
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    try:
        base = by_name(args.scenario)
    except KeyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    e2e: dict[int, list[float]] = {1: [], args.m: []}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for rep in range(args.repeats):
            for m in e2e:
                got, text = record(base, m, root / f"{base.name}-m{m}-r{rep}")
                e2e[m].append(got)
                print(f"{base.name} m={m} run {rep}: {text}", flush=True)
    one, many = statistics.median(e2e[1]), statistics.median(e2e[args.m])
    print(f"{base.name}: E2E p50 median m=1 {one:.3f} s, m={args.m} {many:.3f} s "
          f"({many / one - 1:+.0%})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
