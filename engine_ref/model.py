"""A Llama-style decoder (Llama, Qwen2 and Qwen2-MoE checkpoints) over a paged KV cache.

Tokens of all sequences in a step are flattened into one [T] batch; `positions` carries each
token's position and the attention backend maps tokens to sequences through the metadata.
q/k/v and gate/up projections are fused (one GEMM each); the loader fuses checkpoints' split
tensors. The arithmetic follows Hugging Face's (fp32 RMSNorm, rotate-half RoPE) so logits
match `transformers` to fp32 tolerance.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import BACKENDS, AttentionMetadata
from .config import ModelConfig
from .moe import SparseMoeBlock


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; the same values as the spelled-out form
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()  # Hugging Face's order for half types: normalise in fp32, then scale
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] (fp32), with linear or Llama-3 scaling."""
    d, rope = cfg.head_dim, cfg.rope
    inv = 1.0 / (rope.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if rope.type == "linear":
        inv = inv / rope.factor
    elif rope.type == "llama3":
        old = rope.original_max_position_embeddings
        low_wl, high_wl = old / rope.low_freq_factor, old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / rope.factor, inv)
        smooth = (old / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class RotaryEmbedding(nn.Module):
    """cos/sin tables [max_positions, head_dim], looked up once per forward. The sin table
    carries rotate-half's sign, so x·cos + rotate_half(x)·sin = x·cos + roll(x)·sin_signed."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        t = torch.arange(cfg.max_position_embeddings, dtype=torch.int64).float()
        freqs = torch.outer(t, rope_inv_freq(cfg))
        self.register_buffer("cos", torch.cat((freqs, freqs), -1).cos(), persistent=False)
        sin = freqs.sin()
        self.register_buffer("sin_signed", torch.cat((-sin, sin), -1), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        cos, sin = self.cos[positions], self.sin_signed[positions]
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, 1, D]."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.scale = cfg.head_dim**-0.5
        self.backend = BACKENDS[backend]
        self.comm = None  # tensor parallelism (parallel.py): sums o_proj's partial outputs

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata):
        t = x.shape[0]
        qkv = self.qkv_proj.forward(x)  # nn.Linear, or quant.QuantLinear (packed weights)
        # RoPE on q and k together: they are adjacent heads of the fused projection.
        qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
        qk = apply_rope(qk, cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        o = self.backend(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        out = self.o_proj.forward(o.reshape(t, self.q_size))
        return out if self.comm is None else self.comm.all_reduce(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.comm = None  # tensor parallelism (parallel.py): sums down_proj's partial outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).chunk(2, dim=-1)
        out = self.down_proj.forward(F.silu(gate) * up)
        return out if self.comm is None else self.comm.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoeBlock(cfg) if cfg.is_moe else MLP(cfg)

    def forward(self, x, cos, sin, kv_cache, meta):
        # The hot path calls submodules' forward directly: nn.Module.__call__ costs ~10 µs a
        # call on a small CPU, 70 calls a step, and no hooks are used here.
        h = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, kv_cache, meta)
        x = x + h
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class LlamaModel(nn.Module):
    def __init__(
        self, cfg: ModelConfig, attention_backend: str = "sdpa", kernel_backend: str = "torch"
    ) -> None:
        super().__init__()
        self.config = cfg
        self.kernel_backend = kernel_backend
        self._kernel_forward = None  # a kernel backend's forward (imported lazily)
        self._kernel_logits = None  # and its logits, where it has its own (None: not fused)
        if kernel_backend == "triton":
            from .kernels.forward import triton_forward

            self._kernel_forward = triton_forward
        elif kernel_backend == "numba":
            from .cpu_forward import numba_forward, numba_logits

            self._kernel_forward, self._kernel_logits = numba_forward, numba_logits
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, attention_backend) for _ in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        """Final hidden states [T, hidden] of every token in the batch."""
        if self._kernel_forward is not None:
            return self._kernel_forward(self, input_ids, positions, kv_caches, meta)
        return self.torch_forward(input_ids, positions, kv_caches, meta)

    def torch_forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata):
        """The PyTorch path (also the kernel backends' path for steps they do not fuse)."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x = layer.forward(x, cos, sin, kv, meta)
        return self.norm.forward(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._kernel_logits is not None:
            logits = self._kernel_logits(self, hidden)
            if logits is not None:
                return logits
        if self.lm_head is None:  # tied, float
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head.forward(hidden).float()


@torch.no_grad()
def init_random_weights(model: LlamaModel, cfg: ModelConfig) -> None:
    """Deterministic weights from `cfg.seed`, drawn on the CPU in fp32 in parameter order so
    every device and dtype starts from the same values."""
    gen = torch.Generator().manual_seed(cfg.seed)
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name == "norm.weight":
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * cfg.initializer_range)
