"""`perfdiag run`'s flags as data: each parameter's name, value type, help panel and
default. `perfdiag sweep` and `perfdiag capacity` speak the same flags per point, so they
read this table rather than the CLI; cli/run.py's typer signature is the user-facing
declaration of the same flags, and tests/test_run_flags.py checks the two agree."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINE = "Engine"
WORKLOAD = "Workload"
PROBES = "Probes"
TARGET = "Target (HTTP)"


@dataclass(frozen=True)
class RunFlag:
    name: str  # the parameter's name (chunk_size for --chunk-size)
    type: type  # its value's type: str, int, float, bool or Path
    panel: str | None  # its --help panel; None: the general options
    default: Any = None  # None, or False for a switch: "not given"


def _flags(panel: str | None, *specs: tuple) -> tuple[RunFlag, ...]:
    """Flags of one panel; a switch (bool) defaults to False, anything else to None."""
    return tuple(RunFlag(n, kind, panel, False if kind is bool else None) for n, kind in specs)


# fmt: off
RUN_FLAGS: tuple[RunFlag, ...] = (
    *_flags(ENGINE, ("preset", str), ("model_dir", Path), ("model_file", Path),
            ("weights", str), ("device", str), ("dtype", str), ("kv_cache_mb", float),
            ("kv_blocks", int), ("kv_dtype", str), ("kv_offload_mb", float), ("block_size", int),
            ("chunk_size", int),
            ("no_chunked_prefill", bool)),
    RunFlag("prefix_cache", bool, ENGINE),  # --prefix-cache/--no-prefix-cache: None, not given
    *_flags(ENGINE, ("max_seqs", int), ("max_batched_tokens", int), ("preemption", str),
            ("policy", str), ("max_wait_ms", float), ("model_seed", int),
            ("kernel_backend", str), ("cuda_graphs", bool), ("tp", int), ("pp", int),
            ("pp_microbatches", int), ("pp_layers", str), ("dp", int),
            ("router", str), ("expert_bias", str), ("expert_placement", str),
            ("speculative", str), ("async_scheduling", bool)),
    *_flags(WORKLOAD, ("workload", str), ("requests", int), ("warmup", int), ("rate", float),
            ("concurrency", int), ("arrival", str), ("burstiness", float), ("closed", bool),
            ("prompt_len", str), ("output_len", str), ("shared_prefix", str),
            ("cancel_fraction", float), ("cancel_after_tokens", int),
            ("cancel_after_s", float), ("replay", Path), ("replay_timestamps", bool),
            ("seed", int)),
    *_flags(PROBES, ("profile_steps", str), ("sample_period", float),
            ("no_device_sampling", bool), ("no_nvtx", bool), ("record_text", bool),
            ("no_triton_probe", bool)),
    *_flags(None, ("out_dir", Path), ("like", Path), ("quiet", bool)),
    *_flags(TARGET, ("target", str), ("api_key", str), ("launch", str),
            ("launch_timeout", float), ("metrics_period", float), ("server_profile", str),
            ("clients", int), ("ray", str)),
)
# fmt: on


@functools.cache
def run_flag_defaults() -> dict[str, Any]:
    """Every run flag with its default (None or False: not given)."""
    return {f.name: f.default for f in RUN_FLAGS}


@functools.cache
def flag_types() -> dict[str, type]:
    """Every run flag with its value's type."""
    return {f.name: f.type for f in RUN_FLAGS}


@functools.cache
def engine_flags() -> frozenset[str]:
    """The flags that configure engine_ref (the Engine panel): an HTTP server's own."""
    return frozenset(f.name for f in RUN_FLAGS if f.panel == ENGINE)
