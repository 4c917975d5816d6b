"""Trim a vLLM worker trace (torch profiler, Kineto JSON) to a few steps, for tests/data.

    .venv/bin/python tests/data/vllm/profile/trim_trace.py SRC DEST [--first K] [--count N]

Keeps the header (every top-level key but `traceEvents`: baseTimeNanoseconds, the
device properties, vLLM's version), the metadata events (`ph: M`), and every other event
that starts between the start of step K and the start of step K + N (the engine loop's
host work after the last kept step included). Steps are vLLM's `execute_context_*`
annotations in time order; K defaults to the first step with a prompt in it (its context
count > 0), so the excerpt has a prefill step and the decode steps after it. DEST is
gzipped when it ends in .gz.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys

STEP = re.compile(r"^execute_(\d+_)?context_(\d+)")


def _open(path: str, mode: str):
    return gzip.open(path, mode + "t") if path.endswith(".gz") else open(path, mode)


def trim(src: str, dest: str, first: int | None, count: int) -> tuple[int, int, list[str]]:
    with _open(src, "r") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    steps = sorted((e for e in events if e.get("ph") == "X" and STEP.match(str(e.get("name")))),
                   key=lambda e: e["ts"])  # fmt: skip
    if first is None:
        first = next((i for i, e in enumerate(steps) if int(STEP.match(e["name"]).group(2)) > 0),
                     0)  # fmt: skip
    kept_steps = steps[first : first + count]
    if not kept_steps:
        sys.exit(f"{src}: no step {first} (it has {len(steps)} steps)")
    lo = kept_steps[0]["ts"]
    hi = steps[first + count]["ts"] if first + count < len(steps) else float("inf")
    kept = [e for e in events if e.get("ph") == "M" or ("ts" in e and lo <= e["ts"] < hi)]
    with _open(dest, "w") as f:
        json.dump({**doc, "traceEvents": kept}, f, separators=(",", ":"))
    return len(events), len(kept), [e["name"] for e in kept_steps]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("dest")
    p.add_argument("--first", type=int, default=None, help="the first step kept (from 0)")
    p.add_argument("--count", type=int, default=3, help="steps kept")
    a = p.parse_args()
    total, kept, names = trim(a.src, a.dest, a.first, a.count)
    print(f"{a.dest}: {kept:,} of {total:,} events, steps {', '.join(names)}")


if __name__ == "__main__":
    main()
