"""EngineConfig's pipeline-parallel fields checked (pure Python: the CLI validates flags
without importing torch). `config.py` calls `check_pipeline` when `pipeline_parallel_size`
is above 1."""

from __future__ import annotations

import os

from ..errors import ConfigError


def check_pipeline(config) -> None:
    """A one-line ConfigError for a pipeline the engine cannot run."""
    pp, m, layers = config.pipeline_parallel_size, config.model, config.pipeline_layers
    if not 1 <= pp <= 64:
        raise ConfigError(f"pipeline_parallel_size must be within [1, 64], got {pp}")
    if pp > m.num_layers:
        raise ConfigError(f"--pp {pp} needs at least {pp} layers; the model has {m.num_layers}")
    if not 0 <= config.pipeline_microbatches <= 1024:
        raise ConfigError(f"--pp-microbatches must be within [1, 1024] (0: as many as stages), "
                         f"got {config.pipeline_microbatches}")  # fmt: skip
    if layers and (len(layers) != pp or sum(layers) != m.num_layers or min(layers) < 1):
        raise ConfigError(f"--pp-layers {','.join(map(str, layers))}: give each of the {pp} "
                         f"stages >= 1 layer, {m.num_layers} in all")  # fmt: skip
    if config.tensor_parallel_size > 1:
        # Four processes (PP 2 × TP 2) on a two-core host would time-share every core: each
        # stage's all-reduces would wait on a descheduled peer, so its figures would
        # measure the host, not the parallelism. Refused rather than misleading.
        raise ConfigError(
            f"--pp with --tp is not supported yet: {pp * config.tensor_parallel_size} ranks "
            f"on this host's {os.cpu_count()} cores would measure core sharing"
        )
    if config.cache.kv_offload_bytes:
        raise ConfigError("--kv-offload-mb runs without --pp for now (the host tier restores "
                          "into rank 0's pool only)")  # fmt: skip
    if config.async_scheduling:
        raise ConfigError("--async-scheduling runs without --pp for now")
    if config.speculative is not None:
        raise ConfigError("speculative decoding runs without --pp for now")
    if config.weight_format != "float":
        raise ConfigError("pipeline parallelism needs float weights")
    if config.resolved_kernel_backend != "torch" or config.cuda_graphs:
        raise ConfigError("pipeline parallelism runs the torch kernels only (--kernel-backend "
                         "torch, no CUDA graphs) for now")  # fmt: skip
