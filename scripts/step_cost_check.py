"""Which step cost model a recorded run gets, and what it prices (issue 35): the additive
fit or the roofline, both held-out errors, and one more slice of 128/256/512 tokens.

    python scripts/step_cost_check.py RUN [--ceilings-dir DIR]
"""

import argparse
import sys

from perfdiag import load_run
from perfdiag.analyzers.step_cost import fit_step_cost
from perfdiag.analyzers.step_cost_roofline import hardware_of
from perfdiag.analyzers.steptime import StepTimeline
from perfdiag.errors import PerfdiagError


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("--ceilings-dir")
    a = p.parse_args()
    try:
        run = load_run(a.run)
    except (OSError, ValueError, PerfdiagError) as e:
        print(f"step_cost_check: {a.run}: {e}", file=sys.stderr)
        return 1
    hw = hardware_of(run, a.ceilings_dir)
    model = fit_step_cost(StepTimeline.from_run(run, 0), hardware=hw)
    if model is None:
        print("step_cost_check: fewer than 8 steps", file=sys.stderr)
        return 1
    where = f"{hw.device} ({hw.ceilings_kind})" if hw else "no model/device recorded: hinge"
    print(f"{a.run}: steps {len(model.per_step)}, hardware {where}")
    print(f"priced by {model.priced_by}")
    steady = model.per_step[~model.per_step["inflated"].to_numpy(bool)]
    with_prefill = steady["num_prefill_tokens"] > 0
    for label, rows in (
        ("with prefill", steady[with_prefill]),
        ("decode only", steady[~with_prefill]),
    ):
        if len(rows):
            err = (rows["dur_s"] - rows["predicted_s"]).abs() / rows["predicted_s"]
            print(
                f"steps {label}: {len(rows)}, median {rows['dur_s'].median() * 1e3:.2f} ms, "
                f"median |error| {100 * err.median():.0f} %"
            )
    for n in (128, 256, 512):
        print(
            f"one more {n}-token slice: {model.slice_price_s(n) * 1e3:.3f} ms "
            f"(additive {(model.fixed_s + model.per_prefill_chunk_s) * 1e3:.3f} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
