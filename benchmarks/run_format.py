"""Benchmark the run format: the writer's hot path and loading a run of 1M spans.

Targets (issue "Foundation"): under 2 µs per recorded event amortised (append plus the
conversion and I/O it causes), and a 1M-span run loaded into DataFrames in under 1 s.

    .venv/bin/python benchmarks/run_format.py [--events 2000000] [--spans 1000000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from perfdiag import load_run
from perfdiag.traces.environment import cpu_model, package_version
from perfdiag.traces.schema import Span
from perfdiag.traces.writer import RunWriter

NAMES = [f"kernel_{i}" for i in range(200)]
CATEGORIES = ["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy"]


def machine() -> str:
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"pyarrow {package_version('pyarrow')}, pandas {package_version('pandas')}"
    )


def make_rows(n: int) -> list[Span]:
    t = time.monotonic_ns()
    return [
        Span(NAMES[i % 200], CATEGORIES[i & 3], t + i * 1000, 700, 1, 2, 0, 7, None, i >> 10, i)
        for i in range(n)
    ]


def record(path: Path, rows: list[Span]) -> dict[str, float]:
    """Append prebuilt rows as fast as a probe could, then time what the writer owes:
    the hot path alone, and the amortised cost including conversion and I/O."""
    writer = RunWriter(path, command=["benchmark"], environment_info={"benchmark": True})
    append = writer.table("spans").append
    start = time.perf_counter()
    for row in rows:
        append(row)
    appended = time.perf_counter()
    writer.flush()  # every row converted and written to the stream
    flushed = time.perf_counter()
    writer.close()  # compaction to Parquet
    closed = time.perf_counter()
    n = len(rows)
    return {
        "append_only_us": (appended - start) / n * 1e6,
        "amortised_us": (flushed - start) / n * 1e6,
        "compact_s": closed - flushed,
    }


def stream_load_seconds(path: Path, rows: list[Span], repeats: int) -> list[float]:
    """Load a run still being written (Arrow IPC streams, never compacted)."""
    writer = RunWriter(path, command=["benchmark"], environment_info={"benchmark": True})
    writer.table("spans").extend(rows)
    writer.flush()
    try:
        return load_seconds(path, repeats)
    finally:
        writer.close()


def build_cost_us(n: int) -> float:
    """What building a row costs the probe (positional NamedTuple), for context."""
    start = time.perf_counter()
    make_rows(n)
    return (time.perf_counter() - start) / n * 1e6


def load_seconds(path: Path, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run = load_run(path)
        frame = run.spans
        times.append(time.perf_counter() - start)
        assert len(frame) > 0
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        rec = record(Path(tmp) / "hot", make_rows(args.events))
        print(f"writer: {args.events:,} spans appended")
        print(f"  (building a Span row, the probe's own cost: {build_cost_us(args.events):.3f} µs)")
        print(
            f"  hot path (append only):           {rec['append_only_us']:.3f} µs/event "
            f"({1 / rec['append_only_us']:.2f} M events/s)"
        )
        print(
            f"  amortised (append+convert+write): {rec['amortised_us']:.3f} µs/event "
            f"({1 / rec['amortised_us']:.2f} M events/s)   target < 2 µs"
        )
        print(f"  compaction to Parquet:            {rec['compact_s']:.2f} s")

        path = Path(tmp) / "load"
        record(path, make_rows(args.spans))
        times = load_seconds(path, args.repeats)
        print(
            f"load_run + spans DataFrame, {args.spans:,} spans (Parquet): "
            f"median {statistics.median(times):.3f} s, best {min(times):.3f} s"
            "   target < 1 s"
        )
        times = stream_load_seconds(Path(tmp) / "stream", make_rows(args.spans), args.repeats)
        print(
            f"load_run + spans DataFrame, {args.spans:,} spans (uncompacted Arrow stream): "
            f"median {statistics.median(times):.3f} s, best {min(times):.3f} s"
        )


if __name__ == "__main__":
    main()
