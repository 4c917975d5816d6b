"""Benchmark the probes' cost: the same workload with every always-on probe vs none.

Always-on probes: the recorder (engine hooks: request events, steps, phases; client
timings) writing a run, the device sampler thread, and on CUDA the per-step CUDA events
and NVTX ranges. "None": the same engine and client with no observer and a sink that
drops client events. Runs alternate (none, probes, none, …) on fresh engines, so drift
in the machine's speed hits both alike; the figure is the ratio of median throughputs.
The profiler window's cost is reported separately: step time inside vs outside it.

    .venv/bin/python benchmarks/probe_overhead.py [--preset small] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from perfdiag import load_run
from perfdiag.engine_ref import AsyncLLMEngine, LLMEngine
from perfdiag.probes.client import drive
from perfdiag.probes.device_sampler import DeviceSampler
from perfdiag.probes.profiler_window import ProfilerWindow
from perfdiag.probes.recorder import RunRecorder
from perfdiag.probes.run_options import EngineOptions
from perfdiag.probes.targets import EngineTarget
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec, plan
from perfdiag.traces.environment import cpu_model, package_version
from perfdiag.traces.writer import RunWriter


class DropSink:
    def client_event(self, *args) -> None:
        pass

    def request_done(self, result) -> None:
        pass


def one_run(engine_options, spec, mode: str, tmp: Path, window_steps=None) -> dict:
    engine = LLMEngine(engine_options.engine_config())
    planned = plan(spec, engine.config.model.vocab_size)
    writer = sampler = window = None
    sink = DropSink()
    if mode != "none":
        writer = RunWriter(tmp / f"{mode}-{time.monotonic_ns()}", command=["benchmark"],
                           environment_info={"benchmark": True})  # fmt: skip
        if window_steps:
            window = ProfilerWindow(*window_steps, engine_options.device, writer.path)
        from perfdiag.probes.cuda_timing import make_step_timer

        engine.observer = sink = RunRecorder(
            writer, step_timer=make_step_timer(engine_options.device), window=window
        )
        sampler = DeviceSampler(writer.table("counters").append, 0.2).start()

    async def go():
        async with AsyncLLMEngine(engine) as front:
            start = time.perf_counter()
            progress = await drive(planned, EngineTarget(front), sink, spec.arrival)
            return time.perf_counter() - start, progress.output_tokens

    seconds, tokens = asyncio.run(go())
    result = {"tokens_per_s": tokens / seconds, "seconds": seconds}
    if writer is not None:
        sampler.stop()
        if window is not None:
            info = window.finish(writer, writer.manifest.clock)
            result["window"] = info
        writer.close()
        result["run"] = writer.path
    return result


def step_times_ms(run_path: Path, steps: tuple[int, int]) -> tuple[float, float]:
    s = load_run(run_path).steps
    dur = (s["end_ns"] - s["start_ns"]) / 1e6
    inside = s["step_id"].between(*steps)
    return float(dur[inside].median()), float(dur[~inside & (s["step_id"] > 2)].median())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()},"
          f" torch {package_version('torch')}; preset {args.preset} on {args.device}")  # fmt: skip
    engine_options = EngineOptions(preset=args.preset, device=args.device, prefix_cache=False)
    spec = WorkloadSpec(
        requests=args.requests,
        arrival=ArrivalSpec(mode="closed", concurrency=args.concurrency),
        prompt_len=LengthSpec.parse("uniform:32:128"),
        output_len=LengthSpec(value=args.output_len),
    )
    results: dict[str, list[float]] = {"none": [], "probes": []}
    with tempfile.TemporaryDirectory() as tmp:
        one_run(engine_options, spec, "none", Path(tmp))  # warm caches, lazy inits
        for i in range(args.repeats):
            for mode in ("none", "probes") if i % 2 == 0 else ("probes", "none"):
                r = one_run(engine_options, spec, mode, Path(tmp))
                results[mode].append(r["tokens_per_s"])
                print(f"  repeat {i} {mode:7s} {r['tokens_per_s']:8.1f} tok/s")
        none, probes = statistics.median(results["none"]), statistics.median(results["probes"])
        print(f"median throughput: none {none:.1f} tok/s, always-on probes {probes:.1f} tok/s")
        spread = (max(results["none"]) / min(results["none"]) - 1) * 100
        print(f"probe overhead: {(1 - probes / none) * 100:+.2f} % (target <= 2 %); "
              f"spread of 'none' runs {spread:.1f} %")  # fmt: skip

        window = (10, 20)
        r = one_run(engine_options, spec, "window", Path(tmp), window_steps=window)
        inside, outside = step_times_ms(r["run"], window)
        w = r["window"]
        print(f"profiler window steps {window[0]}-{window[1]}: median step {inside:.2f} ms inside"
              f" vs {outside:.2f} ms outside ({inside / outside:.2f}x); profiler start "
              f"{w['overhead_ns']['profiler_start'] / 1e6:.0f} ms and stop "
              f"{w['overhead_ns']['profiler_stop'] / 1e6:.0f} ms between steps; "
              f"{w['spans']} spans; run throughput {r['tokens_per_s']:.1f} tok/s")  # fmt: skip


if __name__ == "__main__":
    main()
