"""The small recorded run the --verify-advice tests re-run: tiny, a closed loop of 2,
prompts long enough that a 16-token chunk slices them."""

from __future__ import annotations

from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec


def record_tiny(path, **engine):
    options = RunOptions(
        EngineOptions(preset="tiny", kv_cache_mb=8.0, **engine),
        WorkloadSpec(requests=14, warmup=2, seed=5, arrival=ArrivalSpec("closed", 2),
                     prompt_len=LengthSpec.parse("uniform:160:288"),
                     output_len=LengthSpec.parse("uniform:4:8")),
        ProbeOptions(device_sampling=False),
    )  # fmt: skip
    record_run(options, path, command=["pytest"])
    return path
