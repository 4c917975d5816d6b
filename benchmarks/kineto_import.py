"""Benchmark Kineto trace import plus timeline analysis, end to end.

Targets (issue 6): at least 200k trace events per second from the trace file to the
timeline report, and under 1 GB peak memory (resident set) for a 1M-event trace. Each
case runs in a fresh interpreter so its peak RSS is its own (interpreter, pandas and
pyarrow included); the time excludes interpreter start-up and imports.

    .venv/bin/python benchmarks/kineto_import.py [--events 1000000] [--trace PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perfdiag.traces.environment import cpu_model, package_version

V100 = Path(__file__).resolve().parents[1] / "tests/data/kineto/v100_train_ns_resolution.json.gz"
KERNELS = [
    "volta_sgemm_128x64_nn",
    "void at::native::vectorized_elementwise_kernel<4>",
    "flash_fwd_kernel",
    "void at::native::layer_norm_kernel<float>",
]


def machine() -> str:
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"pyarrow {package_version('pyarrow')}, pandas {package_version('pandas')}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def synthesize(path: Path, events: int) -> int:
    """A Kineto-like trace: per launch a CPU op, its cudaLaunchKernel, the kernel and the
    two ac2g flow ends, every 100 launches a ProfilerStep; µs timestamps with ns digits."""
    base = 1712195495500000_000  # ns
    n = 0
    with open(path, "w") as f:
        f.write(
            '{"schemaVersion": 1, "distributedInfo": {"rank": 0}, "deviceProperties": '
            '[{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": [\n'
        )
        i = 0
        gpu_t = base
        while n < events:
            t = base + i * 9_137
            if i % 100 == 0:
                f.write(
                    f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{i // 100}", '
                    f'"pid": 1, "tid": 1, "ts": {t / 1000:.3f}, "dur": 913.700, "args": {{}}}},\n'
                )
                n += 1
            gpu_t = max(gpu_t, t + 6_000) + 1_234
            dur = 2_000 + (i * 7919) % 9_000
            k = KERNELS[i % 4]
            f.write(
                f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op{i % 50}", "pid": 1, "tid": 1, '
                f'"ts": {t / 1000:.3f}, "dur": 8.500, "args": {{"External id": {i}, '
                f'"Input Dims": [[64, 128], [128]], "Input type": ["float", "float"]}}}},\n'
                f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, '
                f'"tid": 1, "ts": {(t + 1_000) / 1000:.3f}, "dur": 5.125, "args": '
                f'{{"External id": {i}, "cbid": 211, "correlation": {i}}}}},\n'
                f'{{"ph": "s", "id": {i}, "pid": 1, "tid": 1, "ts": {(t + 1_000) / 1000:.3f}, '
                f'"cat": "ac2g", "name": "ac2g"}},\n'
                f'{{"ph": "X", "cat": "kernel", "name": "{k}", "pid": 0, "tid": 7, '
                f'"ts": {gpu_t / 1000:.3f}, "dur": {dur / 1000:.3f}, "args": {{"External id": {i}, '
                f'"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": {i}, '
                f'"registers per thread": 32, "grid": [128, 1, 1], "block": [256, 1, 1]}}}},\n'
                f'{{"ph": "f", "id": {i}, "pid": 0, "tid": 7, "ts": {gpu_t / 1000:.3f}, '
                f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}'
            )
            gpu_t += dur
            n += 5
            i += 1
            f.write(",\n" if n < events else "\n")
        f.write('],\n"traceName": "synthetic", "displayTimeUnit": "ms"}\n')
    return n


CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.reader import load_run
from perfdiag.analyzers.report import timeline_report
t1 = time.perf_counter()
jobs = int(sys.argv[3]) if sys.argv[3] != "auto" else None
s = import_kineto([sys.argv[1]], sys.argv[2], jobs=jobs)
t2 = time.perf_counter()
rep = timeline_report(load_run(sys.argv[2]))
t3 = time.perf_counter()
print(json.dumps({
    "events": s.events, "spans": rep.spans, "import_s": t2 - t1, "analysis_s": t3 - t2,
    "imports_s": t1 - t0, "windows": len(rep.windows), "kernels_linked": rep.kernels_linked,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "workers": load_run(sys.argv[2]).manifest.extra["kineto"]["files"][0]["workers"],
}))
"""


def measure(trace: Path, workdir: Path, jobs: str) -> dict:
    out = workdir / f"run-{trace.name.split('.')[0]}-{jobs}"
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(trace), str(out), jobs], capture_output=True, text=True
    )
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout)


def report(label: str, m: dict) -> None:
    total = m["import_s"] + m["analysis_s"]
    print(
        f"{label}: {m['events']:,} events, {m['spans']:,} spans, {m['windows']} windows, "
        f"{m['kernels_linked']:.1%} kernels linked\n"
        f"  import {m['import_s']:.2f} s + timeline {m['analysis_s']:.2f} s = {total:.2f} s"
        f" -> {m['events'] / total:,.0f} events/s end to end "
        f"(import alone {m['events'] / m['import_s']:,.0f} events/s); "
        f"peak RSS {m['peak_rss_mb']:,.0f} MB"
        + (
            f" (+ {m['workers']} reader processes, each under {m['worker_peak_rss_mb']:,.0f} MB)"
            if m["workers"] > 1
            else ""
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--trace", type=Path, default=V100)
    ap.add_argument(
        "--jobs", default="auto", help="reader processes for the synthetic trace, or 'auto'"
    )
    args = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="perfdiag-kineto-bench-") as tmp:
        tmp = Path(tmp)
        if args.trace.exists():
            report(args.trace.name, measure(args.trace, tmp, "auto"))
        else:
            print(f"{args.trace}: not found, skipped")
        synthetic = tmp / "synthetic.json"
        t = time.perf_counter()
        n = synthesize(synthetic, args.events)
        size = synthetic.stat().st_size
        print(
            f"synthetic trace: {n:,} events, {size / 1e6:,.0f} MB, "
            f"written in {time.perf_counter() - t:.1f} s"
        )
        report(f"synthetic (jobs {args.jobs})", measure(synthetic, tmp, args.jobs))


if __name__ == "__main__":
    main()
