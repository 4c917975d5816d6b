"""Engine configuration: frozen dataclasses validated on construction, and the model presets.

Configs are built once at the edge and passed down; nothing below reads the environment.
Invalid values raise `ConfigError` (a `PerfdiagError`) with one line saying what is wrong.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, replace

from ..errors import ConfigError
from .speculative.spec_config import SpeculativeConfig

ARCHITECTURES = ("llama", "qwen2", "qwen2_moe")
ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("sdpa", "naive")
KERNEL_BACKENDS = ("auto", "torch", "triton", "numba")  # auto: torch on the CPU, triton on CUDA
PREEMPTION_MODES = ("recompute", "swap")
POLICIES = ("fcfs", "prefix")
# Weight-only quantisation (quant.py): "float" weights in the run's dtype, or GGUF blocks
# kept packed and dequantised inside the matmul.
WEIGHT_FORMATS = ("float", "q4_1", "q8_0")
KV_DTYPES = ("auto", "int8", "fp8")  # kv_quant.py; "auto": the model's dtype


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding settings (Hugging Face `rope_parameters` vocabulary)."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        _require(self.theta > 0, f"rope theta must be > 0, got {self.theta}")
        _require(self.type in ROPE_TYPES, f"rope type {self.type!r} is not one of {ROPE_TYPES}")
        _require(self.factor > 0, f"rope factor must be > 0, got {self.factor}")
        if self.type == "llama3":
            _require(
                self.high_freq_factor > self.low_freq_factor > 0,
                "llama3 rope needs high_freq_factor > low_freq_factor > 0",
            )


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP; with
    `num_experts` > 0 every layer's MLP is a Qwen2-MoE sparse block (engine_ref/moe.py)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0: hidden_size // num_heads
    architecture: str = "llama"
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has q/k/v biases
    o_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    initializer_range: float = 0.02
    seed: int = 0
    # Where the weights come from: "random" (initialised from `seed`) or "ckpt:<digest>".
    # It is part of the prefix-cache fingerprint, so another checkpoint never hits.
    weights: str = "random"
    name: str = "custom"
    # Mixture of experts (Qwen2-MoE): 0 experts = a dense MLP of `intermediate_size`.
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # each routed expert's SwiGLU width
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    norm_topk_prob: bool = False  # renormalise the top-k probabilities to sum to 1
    # Added to these experts' router logits before the softmax: (expert, bias) pairs. A
    # real change of routing (a fault for the scenarios), and part of the fingerprint.
    router_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.head_dim == 0 and self.num_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            _require(getattr(self, name) >= 1, f"model {name} must be >= 1")
        _require(self.num_heads >= 1 and self.num_kv_heads >= 1, "model needs >= 1 head")
        _require(
            self.num_heads % self.num_kv_heads == 0,
            f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
            f"({self.num_kv_heads})",
        )
        _require(self.head_dim >= 2 and self.head_dim % 2 == 0, "head_dim must be even, >= 2")
        _require(self.architecture in ARCHITECTURES, f"architecture {self.architecture!r}?")
        _require(self.rms_norm_eps > 0, "rms_norm_eps must be > 0")
        _require(self.max_position_embeddings >= 2, "max_position_embeddings must be >= 2")
        _require(self.initializer_range > 0, "initializer_range must be > 0")
        for t in (
            *self.eos_token_ids,
            *(() if self.bos_token_id is None else (self.bos_token_id,)),
        ):
            _require(0 <= t < self.vocab_size, f"special token id {t} outside the vocabulary")
        object.__setattr__(
            self, "router_bias", tuple((int(e), float(b)) for e, b in self.router_bias)
        )
        if self.num_experts or self.architecture == "qwen2_moe":
            self._check_moe()
        _require(not self.router_bias or self.num_experts > 0,
                 "a router bias needs a mixture-of-experts model")  # fmt: skip

    def _check_moe(self) -> None:
        e, k = self.num_experts, self.num_experts_per_tok
        _require(e >= 1, "a qwen2_moe model needs num_experts >= 1")
        _require(1 <= k <= e, f"num_experts_per_tok must be within [1, {e}], got {k}")
        _require(self.moe_intermediate_size >= 1, "moe_intermediate_size must be >= 1")
        _require(self.shared_expert_intermediate_size >= 0,
                 "shared_expert_intermediate_size must be >= 0")  # fmt: skip
        for x, b in self.router_bias:
            _require(0 <= x < e, f"router bias names expert {x}; the model has 0..{e - 1}")
            _require(math.isfinite(b), f"router bias of expert {x} must be finite")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def _param_counts(self) -> tuple[int, int]:
        """(resident, active per token) parameters: a token runs its top-k experts only."""
        h, d = self.hidden_size, self.head_dim
        qkv = h * (self.num_heads + 2 * self.num_kv_heads) * d
        attn = qkv + self.num_heads * d * h
        if self.qkv_bias:
            attn += (self.num_heads + 2 * self.num_kv_heads) * d
        if self.is_moe:
            expert = 3 * h * self.moe_intermediate_size
            shared = 3 * h * self.shared_expert_intermediate_size
            shared += h if self.shared_expert_intermediate_size else 0  # its sigmoid gate
            router = h * self.num_experts
            mlp = router + shared + self.num_experts * expert
            mlp_active = router + shared + self.num_experts_per_tok * expert
        else:
            mlp = mlp_active = 3 * h * self.intermediate_size
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        rest = self.vocab_size * h + head + h
        per_layer = attn + 2 * h
        return (
            self.num_layers * (per_layer + mlp) + rest,
            self.num_layers * (per_layer + mlp_active) + rest,
        )

    @property
    def num_params(self) -> int:
        """Every parameter the model holds (all experts: what memory must keep resident)."""
        return self._param_counts()[0]

    @property
    def num_active_params(self) -> int:
        """Parameters one token computes with (its top-k experts, not all): the P of
        `2·P·N` FLOPs. Equals `num_params` for a dense model."""
        return self._param_counts()[1]

    def fingerprint(self, dtype: str) -> bytes:
        """Identity of everything that shapes the KV a token produces: architecture, weights,
        dtype and RoPE settings. Prefix-cache keys are chained from it."""
        fields = asdict(self)
        fields.pop("name")
        text = repr(sorted(fields.items())) + f"|dtype={dtype}"
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        if name not in PRESETS:
            from .preset_names import FILE_PRESETS  # not gguf_loader: no torch for an error

            raise ConfigError(
                f"unknown model preset {name!r}; choose one of {sorted([*PRESETS, *FILE_PRESETS])}"
            )
        return replace(PRESETS[name], **overrides)


# The byte tokenizer has 256 byte ids + BOS 256 + EOS 257 + PAD 258.
BYTE_VOCAB = 259
PRESETS: dict[str, ModelConfig] = {
    # Tests: milliseconds per step. A wide initialiser spreads the logits so greedy argmax has
    # clear winners (no fp32 near-ties between the paged engine and the dense reference).
    "tiny": ModelConfig(
        name="tiny",
        vocab_size=BYTE_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=512,
        bos_token_id=256,
        eos_token_ids=(257,),
        initializer_range=0.1,
    ),
    # The CPU demo default: ~24 M parameters, 8 layers, GQA 8:2.
    "small": ModelConfig(
        name="small",
        vocab_size=BYTE_VOCAB,
        hidden_size=512,
        intermediate_size=1536,
        num_layers=8,
        num_heads=8,
        num_kv_heads=2,
        max_position_embeddings=2048,
        bos_token_id=256,
        eos_token_ids=(257,),
    ),
}
# Mixture of experts (Qwen2-MoE): the dense presets' attention and sizes, the MLP replaced by
# 8 experts (top-2) and a shared expert like Qwen1.5-MoE's. `tiny-moe`: tests, milliseconds
# per step. `small-moe`: the CPU demo, ~62 M parameters resident and ~24 M active per token
# (the dense `small`'s compute per token, 2.5× its weights).
_MOE = dict(architecture="qwen2_moe", qkv_bias=True, num_experts=8, num_experts_per_tok=2)
PRESETS["tiny-moe"] = replace(PRESETS["tiny"], name="tiny-moe", moe_intermediate_size=32,
                              shared_expert_intermediate_size=64, **_MOE)  # fmt: skip
PRESETS["small-moe"] = replace(PRESETS["small"], name="small-moe", moe_intermediate_size=512,
                               shared_expert_intermediate_size=512, **_MOE)  # fmt: skip


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV pool: fixed-size blocks on the device, a CPU swap tier, a prefix cache."""

    block_size: int = 16
    num_gpu_blocks: int | None = None  # None: as many as `kv_cache_bytes` holds
    kv_cache_bytes: int = 256 * 2**20
    num_cpu_blocks: int | None = None  # None: as many as the device pool; 0 disables swap
    enable_prefix_caching: bool = True
    watermark: float = 0.01  # fraction of the pool admission always leaves free
    # Debug mode: the block manager records owners and the runner checks every slot it
    # reads or writes against them (tests turn it on; it costs Python time per step).
    check_ownership: bool = False
    # KV storage: "auto" (the model's dtype), or "int8" / "fp8" (e4m3) with one fp32 scale
    # per token and KV head (kv_quant.py): about 2-4x the blocks in the same bytes.
    kv_dtype: str = "auto"
    # The prefix cache's host tier (host_tier.py): bytes of host memory that keep prefix
    # blocks the device pool evicts, restored by copy on a later hit; 0 = no host tier.
    kv_offload_bytes: int = 0

    def __post_init__(self) -> None:
        _require(self.block_size >= 1, "block_size must be >= 1")
        _require(self.kv_offload_bytes >= 0, "kv_offload_bytes must be >= 0")
        _require(self.kv_dtype in KV_DTYPES,
                 f"kv_dtype {self.kv_dtype!r} is not one of {KV_DTYPES}")  # fmt: skip
        _require(
            self.num_gpu_blocks is None or self.num_gpu_blocks >= 1, "num_gpu_blocks must be >= 1"
        )
        _require(self.kv_cache_bytes >= 1, "kv_cache_bytes must be >= 1")
        _require(
            self.num_cpu_blocks is None or self.num_cpu_blocks >= 0, "num_cpu_blocks must be >= 0"
        )
        _require(0.0 <= self.watermark < 1.0, "watermark must be in [0, 1)")


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching: token budget, sequence cap, chunked prefill, preemption, fairness."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    chunk_size: int = 512  # most prefill tokens one request gets in one step
    preemption_mode: str = "recompute"
    # "fcfs": arrival order; "prefix": longest cached prefix first (cache-friendly). Either way
    # a request waiting longer than `max_wait_ms` goes first.
    policy: str = "fcfs"
    max_wait_ms: float | None = 2000.0
    # Admission keeps KV free for each running request's next `decode_reserve_tokens` tokens
    # (decode growth), on top of the watermark, instead of admitting on "free now".
    decode_reserve_tokens: int = 16

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, "max_num_seqs must be >= 1")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1")
        _require(self.chunk_size >= 1, "chunk_size must be >= 1")
        _require(
            self.preemption_mode in PREEMPTION_MODES,
            f"preemption_mode {self.preemption_mode!r} is not one of {PREEMPTION_MODES}",
        )
        _require(self.policy in POLICIES, f"policy {self.policy!r} is not one of {POLICIES}")
        _require(
            self.max_wait_ms is None or (math.isfinite(self.max_wait_ms) and self.max_wait_ms >= 0),
            "max_wait_ms must be None or a finite number >= 0",
        )
        _require(self.decode_reserve_tokens >= 0, "decode_reserve_tokens must be >= 0")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=lambda: ModelConfig.preset("small"))
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "cpu"
    dtype: str = "float32"
    attention_backend: str = "sdpa"
    max_model_len: int = 0  # 0: the model's max_position_embeddings
    seed: int = 0  # the sampler's generator for requests without their own seed
    model_path: str | None = None  # a local Hugging Face directory or a .gguf file to load
    weight_format: str = "float"  # one of WEIGHT_FORMATS
    # "triton": norms, RoPE, SiLU-and-multiply and paged attention run as the kernels of
    # engine_ref/kernels (attention_backend is then unused); "torch": the PyTorch path;
    # "numba" (CPU, float32): decode-only steps run fused CPU kernels (cpu_kernels.py)
    # between the GEMVs, other steps the PyTorch path.
    kernel_backend: str = "auto"
    # Decode-only steps replay CUDA graphs captured at these batch sizes (CUDA, triton
    # kernels); a batch above the largest, or a size whose capture failed, runs eagerly.
    cuda_graphs: bool = False
    cuda_graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    # Tensor parallelism (parallel.py): one process per rank, heads and MLP columns split.
    tensor_parallel_size: int = 1
    # Mixture of experts over those ranks: the rank of each expert, E / N per rank (empty:
    # contiguous, rank r holding experts [r·E/N, (r+1)·E/N)).
    expert_placement: tuple[int, ...] = ()
    # Pipeline parallelism (pipeline.py): one process per stage of consecutive layers, the
    # step's batch in `pipeline_microbatches` micro-batches (0: one per stage); the layers
    # per stage (empty: as even as possible).
    pipeline_parallel_size: int = 1
    pipeline_microbatches: int = 0
    pipeline_layers: tuple[int, ...] = ()
    # Speculative decoding (speculative/): a proposer drafts, one target forward verifies.
    speculative: SpeculativeConfig | None = None
    # Overlapped scheduling (async_step.py): step N+1 is scheduled and prepared while step
    # N's forward runs (vLLM's --async-scheduling, SGLang's overlap scheduler).
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        if self.max_model_len == 0:
            object.__setattr__(self, "max_model_len", self.model.max_position_embeddings)
        _require(self.dtype in DTYPES, f"dtype {self.dtype!r} is not one of {DTYPES}")
        _require(
            self.device == "cpu" or self.device.startswith("cuda"),
            f"device {self.device!r}: use 'cpu' or 'cuda[:N]'",
        )
        _require(
            self.attention_backend in ATTENTION_BACKENDS,
            f"attention_backend {self.attention_backend!r} is not one of {ATTENTION_BACKENDS}",
        )
        _require(
            self.weight_format in WEIGHT_FORMATS,
            f"weights {self.weight_format!r} is not one of {WEIGHT_FORMATS}",
        )
        _require(
            self.kernel_backend in KERNEL_BACKENDS,
            f"kernel_backend {self.kernel_backend!r} is not one of {KERNEL_BACKENDS}",
        )
        if self.kernel_backend == "numba":
            _require(
                self.device == "cpu" and self.dtype == "float32" and self.weight_format == "float",
                "kernel_backend 'numba' runs float32 weights on the CPU (--device cpu --dtype "
                "float32 --weights float)",
            )
            _require(self.cache.kv_dtype == "auto",
                     "kernel_backend 'numba' reads a float KV cache: --kv-dtype auto")  # fmt: skip
        sizes = tuple(sorted(set(int(b) for b in self.cuda_graph_batch_sizes)))
        object.__setattr__(self, "cuda_graph_batch_sizes", sizes)
        _require(bool(sizes) and sizes[0] >= 1, "cuda_graph_batch_sizes must be >= 1")
        if self.cuda_graphs:
            _require(self.device.startswith("cuda"), "cuda_graphs needs device 'cuda'")
            _require(
                self.resolved_kernel_backend == "triton",
                "cuda_graphs needs kernel_backend 'triton' (its decode attention reads lengths "
                "from the device, so one graph serves every context length)",
            )
        _require(
            2 <= self.max_model_len <= self.model.max_position_embeddings,
            f"max_model_len {self.max_model_len} must be in "
            f"[2, {self.model.max_position_embeddings}]",
        )
        if self.tensor_parallel_size != 1:
            self._check_tensor_parallel()
            _require(self.speculative is None, "speculative decoding runs without --tp for now")
            _require(not self.cache.kv_offload_bytes, "--kv-offload-mb runs without --tp for now")
        if self.async_scheduling:
            _require(
                self.speculative is None,
                "--async-scheduling does not combine with "
                "--speculative yet (drafting needs the step's sampled tokens)",
            )
            _require(self.tensor_parallel_size == 1 and self.pipeline_parallel_size == 1,
                     "--async-scheduling runs without --tp or --pp for now")  # fmt: skip
        object.__setattr__(self, "expert_placement", tuple(int(r) for r in self.expert_placement))
        object.__setattr__(self, "pipeline_layers", tuple(int(n) for n in self.pipeline_layers))
        if self.pipeline_parallel_size != 1 or self.pipeline_layers:
            from .pipeline_config import check_pipeline

            check_pipeline(self)
        if self.expert_placement:
            self._check_expert_placement()
        if self.model.is_moe:
            _require(
                self.weight_format == "float" and self.resolved_kernel_backend == "torch"
                and not self.cuda_graphs,
                "a mixture-of-experts model runs float weights on the torch kernels only "
                "(--kernel-backend torch, no CUDA graphs)",
            )  # fmt: skip
        sched = self.scheduler
        if not sched.enable_chunked_prefill:
            # Without chunking a whole prompt must fit one step's budget.
            _require(
                sched.max_num_batched_tokens >= self.max_model_len,
                f"without chunked prefill max_num_batched_tokens "
                f"({sched.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len})",
            )

    def _check_tensor_parallel(self) -> None:
        tp, m = self.tensor_parallel_size, self.model
        _require(1 <= tp <= 64, f"tensor_parallel_size must be within [1, 64], got {tp}")
        split = ("num_heads", "num_kv_heads")
        if m.is_moe:  # experts are placed whole on ranks; the shared expert is split
            split += ("num_experts", "shared_expert_intermediate_size")
        else:
            split += ("intermediate_size",)
        for name in split:
            _require(
                getattr(m, name) % tp == 0,
                f"tensor parallelism {tp} needs the model's {name} ({getattr(m, name)}) to be "
                f"a multiple of it",
            )
        _require(self.weight_format == "float", "tensor parallelism needs float weights")
        _require(
            self.resolved_kernel_backend == "torch" and not self.cuda_graphs,
            "tensor parallelism runs the torch kernels only (--kernel-backend torch, no CUDA "
            "graphs) for now",
        )

    def _check_expert_placement(self) -> None:
        where, tp, e = self.expert_placement, self.tensor_parallel_size, self.model.num_experts
        _require(
            self.model.is_moe and tp > 1,
            "an expert placement needs a mixture-of-experts model over --tp ranks",
        )
        _require(
            len(where) == e, f"the expert placement names {len(where)} experts; the model has {e}"
        )
        counts = [where.count(r) for r in range(tp)]
        _require(
            all(0 <= r < tp for r in where) and counts == [e // tp] * tp,
            f"the expert placement must give each of the {tp} ranks {e // tp} experts, got "
            f"{counts}",
        )

    @property
    def resolved_kernel_backend(self) -> str:
        if self.kernel_backend != "auto":
            return self.kernel_backend
        return "triton" if self.device.startswith("cuda") else "torch"

    @property
    def max_wait_ns(self) -> int | None:
        ms = self.scheduler.max_wait_ms
        return None if ms is None else int(ms * 1_000_000)
