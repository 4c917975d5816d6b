"""What `perfdiag run` is asked to do: engine, workload and probe options, as data.

Options are flat and serialisable, so a run records exactly what produced it and
`perfdiag run --like RUN` can rebuild them, with any option given again overriding one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .workload import WorkloadSpec, spec_from_mapping

MAX_KV_CACHE_MB = 2**24  # 16 TiB: beyond any device; the free memory is checked too
MAX_SEED = 2**32 - 1  # what every seeded generator here takes


@dataclass(frozen=True)
class EngineOptions:
    preset: str = "small"
    model_dir: str | None = None  # a local Hugging Face checkpoint instead of a preset
    device: str = "cpu"
    dtype: str | None = None  # None: float32 on the CPU, bfloat16 on CUDA
    kv_cache_mb: float = 256.0
    kv_blocks: int | None = None  # overrides kv_cache_mb
    kv_dtype: str = "auto"  # KV storage: the model's dtype, or int8 / fp8 with scales
    kv_offload_mb: float = 0.0  # the prefix cache's host tier (engine_ref/host_tier.py)
    block_size: int = 16
    chunk_size: int | None = 512  # None: chunked prefill off
    prefix_cache: bool = True
    max_seqs: int = 64
    max_batched_tokens: int = 2048
    preemption: str = "recompute"
    policy: str = "fcfs"
    max_wait_ms: float | None = 2000.0
    seed: int = 0
    kernel_backend: str = "auto"  # torch on the CPU, triton on CUDA (engine_ref/kernels)
    cuda_graphs: bool = False  # decode steps replayed from CUDA graphs (CUDA, triton)
    model_seed: int = 0  # a preset's random weights (another seed: another model)
    model_file: str | None = None  # a GGUF file (llama.cpp's format) instead of a preset
    weights: str = "float"  # float, or q4_1 / q8_0 kept packed (weight-only quantisation)
    tp: int = 1  # tensor-parallel ranks (processes), engine_ref/parallel.py
    pp: int = 1  # pipeline stages (processes), engine_ref/pipeline.py
    pp_microbatches: int = 0  # micro-batches per step across the stages (0: one per stage)
    pp_layers: str | None = None  # "N0,N1,…": layers per stage (None: as even as possible)
    dp: int = 1  # data-parallel replicas (threads of this process), engine_ref/replicas.py
    router: str = "round-robin"  # how requests reach the replicas, engine_ref/router.py
    # Mixture of experts: "E:B[,E:B…]" adds B to expert E's router logits (skewed routing)
    expert_bias: str | None = None
    # "R0,R1,…": the rank of each expert over the --tp ranks (None: contiguous)
    expert_placement: str | None = None
    # Speculative decoding: "ngram:K" or "draft:PRESET_OR_FILE:K" (None: off)
    speculative: str | None = None
    async_scheduling: bool = False  # overlapped scheduling, engine_ref/async_step.py

    def __post_init__(self) -> None:
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ConfigError(
                f"chunk size must be >= 1, got {self.chunk_size} "
                "(use --no-chunked-prefill to turn chunking off)"
            )
        if not (math.isfinite(self.kv_cache_mb) and 0 < self.kv_cache_mb <= MAX_KV_CACHE_MB):
            raise ConfigError(
                f"KV cache size must be a number of MiB in (0, {MAX_KV_CACHE_MB:,}], "
                f"got {self.kv_cache_mb}"
            )
        from ..engine_ref.config import KV_DTYPES  # pure Python: no torch
        from ..engine_ref.router import RouterPolicy

        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"--kv-dtype {self.kv_dtype!r}: use one of {', '.join(KV_DTYPES)}")
        if not (math.isfinite(self.kv_offload_mb) and 0 <= self.kv_offload_mb <= MAX_KV_CACHE_MB):
            raise ConfigError(f"--kv-offload-mb must be in [0, {MAX_KV_CACHE_MB:,}] MiB, "
                              f"got {self.kv_offload_mb}")  # fmt: skip

        RouterPolicy.parse(self.router).check_replicas(self.dp)
        if self.dp > 1 and self.tp > 1:
            raise ConfigError("--dp and --tp together are not supported: choose one")
        if self.dp > 1 and self.pp > 1:
            raise ConfigError("--dp and --pp together are not supported: choose one")
        parse_counts("--pp-layers", self.pp_layers)
        if self.expert_bias is not None:
            parse_expert_bias(self.expert_bias)
        if self.expert_placement is not None:
            parse_expert_placement(self.expert_placement)
        if self.speculative is not None:
            parse_speculative_flag(self.speculative)
        for name in ("seed", "model_seed"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_SEED:
                raise ConfigError(f"{name.replace('_', ' ')} must be within [0, {MAX_SEED}], "
                                  f"got {value}")  # fmt: skip

    @property
    def resolved_dtype(self) -> str:
        return self.dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")

    def engine_config(self):
        """The engine's own (validated) configuration."""
        from ..engine_ref.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
        from ..engine_ref.preset_names import FILE_PRESETS  # no torch for built-in presets

        model_path = self.model_dir
        if self.model_file or (not self.model_dir and self.preset in FILE_PRESETS):
            from ..engine_ref.gguf_loader import preset_file, read_gguf_config

            model_path = self.model_file or str(preset_file(self.preset))
            model = read_gguf_config(model_path)
        elif self.model_dir:
            from ..engine_ref.loader import read_model_config

            model = read_model_config(self.model_dir)
        else:
            model = ModelConfig.preset(self.preset, seed=self.model_seed)
        if self.expert_bias:
            model = dataclasses.replace(model, router_bias=parse_expert_bias(self.expert_bias))
        cache = CacheConfig(
            block_size=self.block_size,
            num_gpu_blocks=self.kv_blocks,
            kv_cache_bytes=int(self.kv_cache_mb * 2**20),
            enable_prefix_caching=self.prefix_cache,
            kv_dtype=self.kv_dtype,
            kv_offload_bytes=int(self.kv_offload_mb * 2**20),
        )
        scheduler = SchedulerConfig(
            max_num_seqs=self.max_seqs,
            max_num_batched_tokens=self.max_batched_tokens,
            enable_chunked_prefill=self.chunk_size is not None,
            chunk_size=self.chunk_size or 512,
            preemption_mode=self.preemption,
            policy=self.policy,
            max_wait_ms=self.max_wait_ms,
        )
        return EngineConfig(
            model=model,
            cache=cache,
            scheduler=scheduler,
            device=self.device,
            dtype=self.resolved_dtype,
            seed=self.seed,
            model_path=model_path,
            weight_format=self.weights,
            kernel_backend=self.kernel_backend,
            cuda_graphs=self.cuda_graphs,
            tensor_parallel_size=self.tp,
            pipeline_parallel_size=self.pp,
            pipeline_microbatches=self.pp_microbatches,
            pipeline_layers=parse_counts("--pp-layers", self.pp_layers),
            expert_placement=parse_expert_placement(self.expert_placement or ""),
            speculative=parse_speculative_flag(self.speculative) if self.speculative else None,
            async_scheduling=self.async_scheduling,
        )


def parse_counts(flag: str, text: str | None) -> tuple[int, ...]:
    """'3,5' → (3, 5); None or '' → (); a one-line ConfigError if malformed."""
    if not text or not text.strip():
        return ()
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"bad {flag} {text!r}: whole numbers separated by commas") from None


def parse_expert_bias(text: str) -> tuple[tuple[int, float], ...]:
    """'3:2.0,5:1' → ((3, 2.0), (5, 1.0)): router-logit biases per expert."""
    out = []
    for part in text.split(","):
        expert, _, bias = part.strip().partition(":")
        try:
            e, b = int(expert), float(bias)
        except ValueError:
            raise ConfigError(
                f"bad --expert-bias {text!r}: use EXPERT:BIAS[,EXPERT:BIAS…], e.g. 3:2.0"
            ) from None
        if not (e >= 0 and math.isfinite(b)):
            raise ConfigError(f"bad --expert-bias {text!r}: experts >= 0, finite biases")
        out.append((e, b))
    return tuple(out)


def parse_speculative_flag(text: str):
    """--speculative's value -> SpeculativeConfig; a one-line ConfigError if malformed."""
    from ..engine_ref.speculative.spec_config import parse_speculative  # no torch

    try:
        return parse_speculative(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def parse_expert_placement(text: str) -> tuple[int, ...]:
    """'0,1,1,0' → (0, 1, 1, 0): the rank of each expert ('' → contiguous)."""
    if not text.strip():
        return ()
    try:
        where = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(
            f"bad --expert-placement {text!r}: the rank of each expert, e.g. 0,1,1,0"
        ) from None
    if min(where) < 0:
        raise ConfigError(f"bad --expert-placement {text!r}: ranks are >= 0")
    return where


@dataclass(frozen=True)
class ProbeOptions:
    device_sampling: bool = True
    sample_period_s: float = 0.2
    profile_steps: tuple[int, int] | None = None  # [first, last] engine steps, inclusive
    nvtx: bool = True
    record_text: bool = False  # store prompt and output text (off: digests only)
    triton_launches: bool = True  # every Triton launch as a span (triton kernels only)

    def __post_init__(self) -> None:
        if self.profile_steps is not None:
            first, last = self.profile_steps
            if not 0 <= first <= last:
                raise ConfigError(f"profile steps must be FIRST:LAST with 0 <= FIRST <= LAST, "
                                  f"got {first}:{last}")  # fmt: skip
        if not (math.isfinite(self.sample_period_s) and 0.001 <= self.sample_period_s <= 3600):
            raise ConfigError(
                f"the sampling period must be within [0.001, 3600] s, got {self.sample_period_s}"
            )


@dataclass(frozen=True)
class RunOptions:
    engine: EngineOptions = field(default_factory=EngineOptions)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    probes: ProbeOptions = field(default_factory=ProbeOptions)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunOptions:
        """Rebuild from a manifest's `config.run_options` (for `--like`)."""
        try:
            probes = dict(data.get("probes", {}))
            if probes.get("profile_steps") is not None:
                probes["profile_steps"] = tuple(probes["profile_steps"])
            return cls(
                engine=EngineOptions(**data.get("engine", {})),
                workload=spec_from_mapping(data.get("workload", {})),
                probes=ProbeOptions(**probes),
            )
        except TypeError as e:
            raise ConfigError(f"the recorded run options do not fit this perfdiag: {e}") from None


def parse_step_range(text: str) -> tuple[int, int]:
    """`5:9` (steps 5 to 9 inclusive) or `7` (one step)."""
    try:
        first, _, last = text.partition(":")
        return int(first), int(last or first)
    except ValueError:
        raise ConfigError(f"bad step range {text!r}: use FIRST:LAST, e.g. 10:20") from None
