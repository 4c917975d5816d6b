"""Which draft model, in which weights, with how much KV: a draft's EngineConfig from the
target's config and the `draft` of `--speculative draft:PRESET_OR_FILE:K`.

- a random-weight preset (`tiny`, `small`, …) takes the target's model seed, so the same
  preset as the target is the same model (a perfect draft: tests rely on it);
- a file preset (`smollm2-135m`) or a `.gguf` file runs packed in the file's own format
  (q4_1 or q8_0; float for any other): the quantised copy of a float target;
- a Hugging Face checkpoint directory runs float.

KV: the draft has its own pool. By default it holds as many tokens as the target's pool
(the same block count), so a draft never runs out before the target does; it costs the
target's KV bytes times (draft bytes per token / target bytes per token): for SmolLM2
drafting for itself, as much again. `draft_kv_mb` sets it instead.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ...errors import ConfigError
from ..config import PRESETS, CacheConfig, EngineConfig, ModelConfig

PACKED_FORMATS = ("q4_1", "q8_0")


def draft_model_source(target: EngineConfig, draft: str) -> tuple[ModelConfig, str | None, str]:
    """(model config, weights path or None for random weights, weight format)."""
    from ..preset_names import FILE_PRESETS

    if draft in PRESETS:
        seed = target.model.seed if target.model.weights == "random" else 0
        return ModelConfig.preset(draft, seed=seed), None, "float"
    if draft in FILE_PRESETS or draft.endswith(".gguf"):
        from ..gguf_loader import preset_file, read_gguf_config

        path = str(preset_file(draft)) if draft in FILE_PRESETS else draft
        if not Path(path).is_file():
            raise ConfigError(f"draft model {draft}: no such file")
        return read_gguf_config(path), path, gguf_linear_format(path)
    if Path(draft).is_dir():
        from ..loader import read_model_config

        return read_model_config(draft), draft, "float"
    raise ConfigError(
        f"draft model {draft!r} is neither a preset ({', '.join([*PRESETS, *FILE_PRESETS])}), "
        "a .gguf file nor a checkpoint directory"
    )


def gguf_linear_format(path: str) -> str:
    """The format most of the file's matrices are stored in, if it can stay packed."""
    from ..gguf_loader import open_gguf

    counts = Counter(t.qtype.lower() for t in open_gguf(path).tensors if t.name.startswith("blk."))
    fmt = counts.most_common(1)[0][0] if counts else "float"
    return fmt if fmt in PACKED_FORMATS else "float"


def draft_engine_config(
    target: EngineConfig, draft: str, draft_kv_mb: float | None = None
) -> EngineConfig:
    """The draft's config on the target's device and dtype; refuses another vocabulary."""
    model, path, weight_format = draft_model_source(target, draft)
    if model.vocab_size != target.model.vocab_size:
        raise ConfigError(
            f"draft model {draft} has a vocabulary of {model.vocab_size:,} tokens, the target "
            f"{target.model.name} {target.model.vocab_size:,}: a draft must share the "
            "target's tokenizer"
        )
    from ..engine_build import local_kv_blocks
    from ..kv_cache import num_blocks_for_bytes

    bs = target.cache.block_size
    if draft_kv_mb is None:
        num_blocks = local_kv_blocks(target)[0]  # the target's token capacity
    else:
        if not draft_kv_mb > 0:
            raise ConfigError(f"draft KV size must be > 0 MiB, got {draft_kv_mb}")
        num_blocks = num_blocks_for_bytes(model, bs, target.dtype, int(draft_kv_mb * 2**20))
    kernels = target.kernel_backend
    if model.is_moe or (kernels == "numba" and weight_format != "float"):
        kernels = "torch" if model.is_moe else "auto"
    return EngineConfig(
        model=model,
        cache=CacheConfig(
            block_size=bs,
            num_gpu_blocks=num_blocks,
            num_cpu_blocks=0,  # nothing to swap: a preempted request's draft KV is dropped
            # Off: rejected drafts are overwritten in place, which a shared block forbids.
            enable_prefix_caching=False,
            check_ownership=target.cache.check_ownership,
        ),
        device=target.device,
        dtype=target.dtype,
        max_model_len=min(target.max_model_len, model.max_position_embeddings),
        seed=target.seed,
        model_path=path,
        weight_format=weight_format,
        kernel_backend=kernels,
    )
