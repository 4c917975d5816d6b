"""Which step cost model the steps choose, and how well it prices a prompt slice, on
synthetic steps whose true cost is known (benchmarks/synthetic_steps.py).

    .venv/bin/python -m benchmarks.step_cost_models [--seeds 30] [--steps 400]

For GPU-shaped steps (launch + max(weights and K/V read, compute)) and CPU-shaped ones
(additive), at 1 % and 3 % noise with one step in twenty stalled: over every seed, how
often each model was chosen, and the chosen model's price of one more 512-token slice
beside 8 decodes against the truth (median and worst relative error, share within
20 %), beside what the additive fit alone would price it at.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from perfdiag.analyzers.step_cost import fit_step_cost

from .synthetic_steps import CONTEXT, DECODES, cpu_cost, gpu_cost, timeline, true_slice


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_cost_models")
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args(argv)
    print(f"{args.seeds} seeds of {args.steps} steps each; slice = 512 tokens beside "
          f"{DECODES} decodes")  # fmt: skip
    print(f"{'shape':<5} {'noise':>5}  {'chosen':<22} {'truth ms':>8}  {'median err':>10}  "
          f"{'worst err':>9}  {'within 20 %':>11}  {'additive alone / truth':>22}")  # fmt: skip
    started = time.perf_counter()
    for shape, cost in (("gpu", gpu_cost), ("cpu", cpu_cost)):
        truth = true_slice(cost)
        for noise in (0.01, 0.03):
            chosen, errors, additive = [], [], []
            for seed in range(args.seeds):
                m = fit_step_cost(timeline(cost, seed, args.steps, noise=noise))
                chosen.append(m.chosen)
                price = float(m.slice_price_s(512, DECODES, CONTEXT))
                errors.append(abs(price - truth) / truth)
                add = 2 * m.additive_predict_s(512, DECODES, CONTEXT, 1)
                additive.append(float(add - m.additive_predict_s(1024, DECODES, CONTEXT, 1)))
            counts = ", ".join(f"{k} {chosen.count(k)}" for k in sorted(set(chosen)))
            e = np.asarray(errors)
            print(f"{shape:<5} {noise:>5.0%}  {counts:<22} {truth * 1e3:>8.2f}  "
                  f"{np.median(e):>10.0%}  {e.max():>9.0%}  "
                  f"{(e <= 0.2).sum():>5}/{len(e):<5}  "
                  f"{np.median(additive) / truth:>21.1f}×")  # fmt: skip
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
