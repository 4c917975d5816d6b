"""Benchmark `perfdiag export`: a synthetic run of 1M spans to Perfetto and Chrome JSON.

Target (issue 9): a run of 1M events exports in under 20 s with bounded memory. The run
is written with RunWriter: per launch a CPU op, its cudaLaunchKernel and the kernel (with
Kineto-like args), an engine step every 100 launches, requests whose tokens ran in those
steps, and device counters. Each export runs in a fresh interpreter so its peak RSS is
its own; the time excludes interpreter start-up and imports. Peak RSS is reported beside
the RSS after the run's columns were read, at two sizes, so what grows with the run (the
Arrow columns) is told apart from what the writer holds (one chunk of packets or text).

    .venv/bin/python benchmarks/export.py [--spans 1000000] [--small 250000]
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
from perfdiag.traces.schema import Counter, Request, RequestEvent, Span, Step
from perfdiag.traces.writer import RunWriter

KERNELS = ["volta_sgemm_128x64_nn", "vectorized_elementwise_kernel<4>", "flash_fwd_kernel",
           "layer_norm_kernel<float>"]  # fmt: skip
PER_STEP = 100  # launches per engine step
BATCH = 50_000


def machine() -> str:
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"perfetto {package_version('perfetto')}, protobuf {package_version('protobuf')}, "
        f"pyarrow {package_version('pyarrow')}, load average {os.getloadavg()[0]:.2f}"
    )


def synthesize(path: Path, spans: int) -> None:
    base = 5_000_000_000_000
    launches = spans // 3
    with RunWriter(path, command=["benchmark"], environment_info={"benchmark": True}) as w:
        out = w.table("spans")
        rows = []
        gpu_t = base
        for i in range(launches):
            t = base + i * 9_137
            gpu_t = max(gpu_t, t + 6_000) + 1_234
            dur = 2_000 + (i * 7919) % 9_000
            step = i // PER_STEP
            rows += [
                Span(f"aten::op{i % 50}", "cpu_op", t, 8_500, pid=1, tid=1, step_id=step),
                Span("cudaLaunchKernel", "cuda_runtime", t + 1_000, 5_125, pid=1, tid=1,
                     correlation=i, step_id=step),
                Span(KERNELS[i % 4], "kernel", gpu_t, dur, device=0, stream=7, correlation=i,
                     step_id=step, args='{"grid": [128, 1, 1], "block": [256, 1, 1]}'),
            ]  # fmt: skip
            gpu_t += dur
            if len(rows) >= BATCH:
                out.extend(rows)
                rows = []
        out.extend(rows)
        steps = launches // PER_STEP + 1
        span = PER_STEP * 9_137
        w.table("steps").extend(
            Step(s, base + s * span, base + (s + 1) * span - 1, 0, 0, 8, 800 + s % 64, 2, 8,
                 kv_blocks_used=100 + s % 50) for s in range(steps)
        )  # fmt: skip
        events, requests = [], []
        for r in range(steps // 8):  # each request decodes through 8 steps
            rid = f"req-{r}"
            s0 = r * 8
            t0 = base + s0 * span
            requests.append(Request(rid, 64, 8, 0, "length"))
            events += [
                RequestEvent(rid, "queued", t0 - 1_000),
                RequestEvent(rid, "scheduled", t0 + 10, step_id=s0),
                RequestEvent(rid, "prefill_chunk", t0 + span - 10, step_id=s0, num_tokens=64),
            ]
            events += [RequestEvent(rid, "token", base + (s0 + k + 1) * span - 10, step_id=s0 + k)
                       for k in range(1, 8)]  # fmt: skip
            events.append(RequestEvent(rid, "finished", base + (s0 + 8) * span - 5))
        w.table("requests").extend(requests)
        w.table("request_events").extend(events)
        w.table("counters").extend(
            Counter(name, base + k * 1_000_000, float(k % 100), "gpu0")
            for k in range(launches * 9_137 // 1_000_000)
            for name in ("gpu_util_pct", "power_w")
        )


CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from perfdiag.traces.exporters import export_run
from perfdiag.traces.exporters.layout import SPAN_COLUMNS
from perfdiag.traces.reader import load_run
t1 = time.perf_counter()
run = load_run(sys.argv[1])
run.arrow("spans", SPAN_COLUMNS)  # the columns the export reads, to measure them alone
columns_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t2 = time.perf_counter()
r = export_run(sys.argv[1], sys.argv[2], sys.argv[3])
t3 = time.perf_counter()
print(json.dumps({
    "events": r.events, "flows": r.flows, "bytes": r.bytes, "seconds": t3 - t2,
    "imports_s": t1 - t0, "columns_rss_mb": columns_rss,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def measure(run: Path, fmt: str, out: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(run), fmt, str(out)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=250_000, help="a second size (0: skip)")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="perfdiag-export-bench-") as tmp:
        for n in [s for s in (args.small, args.spans) if s]:
            run = Path(tmp) / f"run-{n}"
            t = time.perf_counter()
            synthesize(run, n)
            print(f"synthetic run: {n:,} spans, written in {time.perf_counter() - t:.1f} s")
            for fmt, suffix in (("perfetto", ".pftrace"), ("chrome", ".trace.json")):
                m = measure(run, fmt, Path(tmp) / f"out-{n}{suffix}")
                print(
                    f"  {fmt:8s} {m['events']:,} events ({m['flows']:,} flows) in "
                    f"{m['seconds']:.2f} s -> {m['events'] / m['seconds']:,.0f} events/s; "
                    f"{m['bytes'] / 1e6:,.0f} MB; peak RSS {m['peak_rss_mb']:,.0f} MB "
                    f"(run's columns read: {m['columns_rss_mb']:,.0f} MB)"
                )
                (Path(tmp) / f"out-{n}{suffix}").unlink()


if __name__ == "__main__":
    main()
