"""The pp-bubbles model on recorded pipeline runs: each run's window per step, its contention
factor k (analyzers/pipeline_overlap.py: measured, or from the cores at m = 1) and the
window it predicts at 1, 2 and 4 micro-batches, beside the same model with k = 1 (the
constant-compute model it replaced).

    .venv/bin/python benchmarks/pipeline_contention.py RUN [RUN ...]

Runs recorded by `perfdiag run --pp 2 --pp-microbatches M ...` (benchmarks/pipeline_parallel.py
--sweep records such a set). Reads runs only; prints one line per run.
"""

from __future__ import annotations

import sys

from perfdiag import load_run
from perfdiag.analyzers import pipeline as P
from perfdiag.errors import PerfdiagError


def line(run_dir: str) -> str:
    s = P.summarize(load_run(run_dir))
    if s is None:
        return f"{run_dir}: no pipeline stages"
    c = s.contention
    flat = s._replace(contention=c._replace(k=1.0, blocked=False))
    per_step = 1e6 * max(s.steps, 1)
    new = "/".join(f"{P.predicted_window(s, m) / per_step:.0f}" for m in (1, 2, 4))
    old = "/".join(f"{P.predicted_window(flat, m) / per_step:.0f}" for m in (1, 2, 4))
    model = c.model + (f", blocked: {c.need_cores:.1f} of {c.cores} cores" if c.blocked else "")
    adv = P.microbatch_advice(s)
    return (f"{run_dir}: m {s.microbatches:g}, window {s.window_ns / per_step:.0f} ms/step, "
            f"k {c.k:.2f} ({model}); predicted m=1/2/4 {new} ms (k = 1: {old}); "
            f"advised m {adv.microbatches} (×{adv.forward_ratio:.2f})")  # fmt: skip


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: benchmarks/pipeline_contention.py RUN [RUN ...]", file=sys.stderr)
        return 1
    try:
        for run_dir in argv:
            print(line(run_dir))
    except PerfdiagError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
