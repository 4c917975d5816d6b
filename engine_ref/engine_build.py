"""The engine's parts built from its config: the model (weights loaded, random or
quantised; the numba step compiled now) and the size of one rank's KV pool."""

from __future__ import annotations

from ..errors import ConfigError
from .config import EngineConfig
from .gguf_loader import is_gguf, load_gguf_weights
from .kv_cache import num_blocks_for_bytes, torch_dtype
from .loader import load_weights
from .model import LlamaModel, init_random_weights


def build_model(config: EngineConfig) -> LlamaModel:
    kernels = config.resolved_kernel_backend
    if kernels == "triton":
        from .kernels._common import check_device

        check_device(config.device)
    elif kernels == "numba":
        try:
            import numba  # noqa: F401
        except ImportError:
            raise ConfigError(
                "kernel_backend 'numba' needs the numba package: pip install 'perfdiag[cpu]'"
            ) from None
    model = LlamaModel(config.model, config.attention_backend, kernels)
    packed: dict = {}
    if is_gguf(config.model_path):
        packed = load_gguf_weights(model, config.model_path, config.weight_format != "float")
    elif config.model_path is not None:
        load_weights(model, config.model_path)
    else:
        init_random_weights(model, config.model)
    model = model.to(device=config.device, dtype=torch_dtype(config.dtype)).eval()
    if config.weight_format != "float":  # weight-only quantisation (quant.py)
        from .quant import quantize_model

        quantize_model(model, config.weight_format, packed)
    if kernels == "numba":
        from .cpu_forward import warm_up

        warm_up(model)  # loads the compiled step now, not in the run's first decode step
    return model


def local_kv_blocks(config: EngineConfig) -> tuple[int, int]:
    """Device and CPU blocks of one rank's pool: `kv_cache_bytes` per rank, each rank
    holding its share of the KV heads (all of them without tensor parallelism) and, with
    pipeline parallelism, its stage's layers."""
    cc, mcfg = config.cache, config.model
    if config.tensor_parallel_size > 1:
        from .parallel_shard import local_model_config

        mcfg = local_model_config(mcfg, config.tensor_parallel_size)
    if config.pipeline_parallel_size > 1:  # each stage holds its layers: the largest one's
        from .pipeline_split import largest_stage_config

        mcfg = largest_stage_config(config)
    num_blocks = cc.num_gpu_blocks or num_blocks_for_bytes(
        mcfg, cc.block_size, config.dtype, cc.kv_cache_bytes, cc.kv_dtype
    )
    return num_blocks, num_blocks if cc.num_cpu_blocks is None else cc.num_cpu_blocks
