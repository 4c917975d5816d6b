"""Analytic FLOPs and bytes of a Llama-style decoder step, per op (pure numpy, no torch).

A step is described by the moments of its batch (`StepShape`), so one call covers any
number of steps at once (every field may be an array). Conventions (docs/timeline.md):
- a matmul of (m×k)·(k×n) is 2·m·n·k FLOPs; bias adds are ignored;
- attention FLOPs are its two matmuls, QKᵀ and PV: 4·H·d per (query, key) pair, with H
  the query heads (GQA shares K/V between heads but not the arithmetic); softmax, scale
  and mask are not counted (as FlashAttention and torch's FlopCounterMode count);
- `causal="exact"` counts only the pairs a causal mask keeps (a prefill chunk of n new
  tokens after c cached ones: n·c + n(n+1)/2); `causal="full"` counts every pair
  (n·(c+n)), which is what a dense masked matmul (and FlopCounterMode) does;
- bytes are the ideal traffic of fused kernels: each weight read once per step,
  activations read and written once per op, K/V read once per sequence per layer
  (FlashAttention: scores never reach memory), new K/V written once, in `kv_bytes`;
- RMSNorm 4 FLOPs/element, RoPE 3, SiLU-and-multiply 5, residual add 1;
- quantised weights (`weight_bytes` packed, `dequant_flops` > 0): each linear layer reads
  its packed weight once and dequantises it once per step (`for_weight_format`);
- a quantised KV cache (`for_kv_dtype`): K/V bytes as stored, one byte an element plus its
  per-(token, head) scale;
- the final norm runs on every token; the LM head only on sampled positions;
- mixture of experts (`num_experts` > 0): a token computes its router, its top-k experts
  and the shared expert (`intermediate_size` is then the shared expert's; 0: none), so
  FLOPs follow the *active* parameters (2·P_active·N, not 2·P·N); a step reads the weights
  of the experts its tokens touched, E·(1 − (1 − k/E)^T) of them for T tokens routed
  uniformly (each expert's weights once), while all E stay resident in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import pandas as pd

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2,
    "bf16": 2, "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "int8": 1, "int4": 0.5,
}  # fmt: skip
_ALIASES = {
    "num_layers": ("num_layers", "num_hidden_layers", "n_layer", "n_layers"),
    "num_heads": ("num_heads", "num_attention_heads", "n_head"),
    "num_kv_heads": ("num_kv_heads", "num_key_value_heads"),
    "hidden_size": ("hidden_size", "dim", "n_embd"),
    "intermediate_size": ("intermediate_size", "ffn_dim"),
    "vocab_size": ("vocab_size",),
    "head_dim": ("head_dim",),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "experts_per_tok": ("num_experts_per_tok", "moe_top_k"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
}


def dtype_bytes(dtype) -> float:
    if isinstance(dtype, (int, float)):
        return float(dtype)
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {sorted(_DTYPE_BYTES)}")
    return float(_DTYPE_BYTES[name])


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a model; `from_dict` reads engine or HF configs."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    weight_bytes: float = 2.0
    act_bytes: float = 2.0
    kv_bytes: float = 2.0
    # Weight-only quantisation: FLOPs per weight each step spends dequantising (d·q + m: 2;
    # float weights: 0). `weight_bytes` is then the packed size (Q4_1 0.625, Q8_0 1.0625).
    dequant_flops: float = 0.0
    # Mixture of experts: routed experts, top-k, each expert's width (0: a dense model).
    num_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    def __post_init__(self):
        if self.dequant_flops < 0:
            raise ValueError("model dequant_flops must be >= 0")
        optional = {"dequant_flops", "num_experts", "experts_per_tok", "moe_intermediate_size"}
        if self.num_experts:  # the shared expert's width; a MoE may have none
            optional.add("intermediate_size")
            if not (1 <= self.experts_per_tok <= self.num_experts and self.moe_intermediate_size):
                raise ValueError("a MoE model needs 1 <= experts_per_tok <= num_experts and "
                                 "moe_intermediate_size > 0")  # fmt: skip
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0 or (f.name not in optional and value == 0):
                raise ValueError(f"model {f.name} must be > 0")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")

    @classmethod
    def from_dict(cls, d: dict, *, dtype=None, kv_dtype=None) -> ModelShape:
        def get(name, default=None):
            for key in _ALIASES[name]:
                if d.get(key) is not None:
                    return int(d[key])
            if default is None:
                raise ValueError(f"model config lacks {name} (keys: {', '.join(sorted(d))})")
            return default

        heads, hidden = get("num_heads"), get("hidden_size")
        head_dim = get("head_dim", 0) or hidden // heads
        w = dtype_bytes(dtype or d.get("dtype") or d.get("torch_dtype") or 2)
        kv = dtype_bytes(kv_dtype or d.get("kv_cache_dtype") or w)
        experts = get("num_experts", -1)
        if experts > 0:  # the dense width is the shared expert's (Mixtral: none, and its
            # intermediate_size is each expert's)
            moe_inter = get("moe_intermediate_size", -1)
            inter = get("shared_expert_intermediate_size", -1)
            if moe_inter <= 0:
                moe_inter, inter = get("intermediate_size"), 0
            moe = (experts, get("experts_per_tok"), moe_inter)
        else:
            moe, inter = (0, 0, 0), get("intermediate_size")
        return cls(
            hidden, get("num_layers"), heads, get("num_kv_heads", heads), head_dim,
            max(inter, 0), get("vocab_size"), w, w, kv, 0.0, *moe,
        )  # fmt: skip


# Packed bytes per weight and dequantisation FLOPs per weight of engine_ref's formats.
WEIGHT_FORMATS = {"q4_1": (20 / 32, 2.0), "q8_0": (34 / 32, 1.0)}


def for_weight_format(m: ModelShape, fmt: str | None) -> ModelShape:
    """The shape with a quantised run's weight bytes and dequantisation work (float: as is)."""
    if fmt not in WEIGHT_FORMATS:
        return m
    wb, dq = WEIGHT_FORMATS[fmt]
    return replace(m, weight_bytes=wb, dequant_flops=dq)


# engine_ref's quantised KV caches (engine_ref/kv_quant.py): one byte an element and one
# fp32 scale per (token, KV head).
KV_QUANT_DTYPES = ("int8", "fp8")
KV_SCALE_BYTES = 4


def for_kv_dtype(m: ModelShape, kv_dtype: str | None) -> ModelShape:
    """The shape with K/V bytes as a quantised cache stores them, the scale spread over
    head_dim; "auto" or None (a run recorded before the field existed): as is."""
    if kv_dtype not in KV_QUANT_DTYPES:
        return m
    return replace(m, kv_bytes=1 + KV_SCALE_BYTES / m.head_dim)


def for_engine_config(m: ModelShape, engine: dict | None) -> ModelShape:
    """The shape as an engine_ref run's `engine_config` (the manifest's) stored it: packed
    weights (`weight_format`) and a quantised KV cache (`cache.kv_dtype`)."""
    if not isinstance(engine, dict):
        return m
    cache = engine.get("cache")
    kv_dtype = cache.get("kv_dtype") if isinstance(cache, dict) else None
    return for_kv_dtype(for_weight_format(m, engine.get("weight_format")), kv_dtype)


@dataclass(frozen=True)
class StepShape:
    """A batch by its moments (scalars or arrays, one entry per step)."""

    prefill_tokens: object = 0  # Σ n, new prompt tokens
    prefill_pairs_exact: object = 0  # Σ n·c + n(n+1)/2, causal (query, key) pairs
    prefill_pairs_full: object = 0  # Σ n·(c + n)
    prefill_kv_tokens: object = 0  # Σ (c + n), K/V each prefill sequence reads
    decode_seqs: object = 0  # B, one new token each
    decode_kv_tokens: object = 0  # Σ (ctx + 1), K/V each decode sequence reads
    sampled: object = 0  # positions whose logits are computed

    @classmethod
    def from_sequences(cls, prefill=(), decode=()) -> StepShape:
        """`prefill`: (new tokens n, cached context c[, samples]) per sequence (samples
        defaults to True: the chunk ends the prompt); `decode`: context length (tokens
        already in the KV cache) per sequence."""
        n = np.array([p[0] for p in prefill], dtype=np.int64)
        c = np.array([p[1] for p in prefill], dtype=np.int64)
        samples = sum(1 for p in prefill if (p[2] if len(p) > 2 else True))
        ctx = np.asarray(list(decode), dtype=np.int64)
        return cls(
            prefill_tokens=int(n.sum()),
            prefill_pairs_exact=int((n * c + n * (n + 1) // 2).sum()),
            prefill_pairs_full=int((n * (c + n)).sum()),
            prefill_kv_tokens=int((c + n).sum()),
            decode_seqs=len(ctx),
            decode_kv_tokens=int((ctx + 1).sum()),
            sampled=samples + len(ctx),
        )


def step_ops(m: ModelShape, s: StepShape, *, causal: str = "exact") -> dict[str, tuple]:
    """{op: (FLOPs, bytes)} for one step (arrays for many), all layers included."""
    if causal not in ("exact", "full"):
        raise ValueError("causal must be 'exact' or 'full'")
    f8 = np.float64
    T = np.asarray(s.prefill_tokens, f8) + np.asarray(s.decode_seqs, f8)
    S = np.asarray(s.sampled, f8)
    h, L, I, V = m.hidden_size, m.num_layers, m.intermediate_size, m.vocab_size  # noqa: E741
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    wb, ab, kb, dq = m.weight_bytes, m.act_bytes, m.kv_bytes, m.dequant_flops
    pairs = np.asarray(s.prefill_pairs_exact if causal == "exact" else s.prefill_pairs_full, f8)
    pairs = pairs + np.asarray(s.decode_kv_tokens, f8)
    kv_read = np.asarray(s.prefill_kv_tokens, f8) + np.asarray(s.decode_kv_tokens, f8)

    def linear(k, n, rows):  # a quantised weight is dequantised once per step (rows > 0)
        return 2 * rows * k * n + dq * k * n * (rows > 0), k * n * wb + rows * (k + n) * ab

    def norm(rows):
        return 4 * rows * h, 2 * rows * h * ab + h * wb

    per_layer = {
        "input_norm": norm(T),
        "qkv_proj": linear(h, q + 2 * kv, T),
        "rope": (3 * T * (q + kv), 2 * T * (q + kv) * ab),
        "attention": (
            4 * m.num_heads * m.head_dim * pairs,
            2 * T * q * ab + 2 * kv * kb * kv_read + 2 * T * kv * kb,
        ),
        "o_proj": linear(q, h, T),
        "residual_add": (2 * T * h, 2 * 3 * T * h * ab),
        "post_attention_norm": norm(T),
        "gate_up_proj": linear(h, 2 * I, T),
        "silu_and_mul": (5 * T * I, 3 * T * I * ab),
        "down_proj": linear(I, h, T),
    }
    if m.num_experts:
        per_layer.update(_moe_ops(m, T, linear))
    ops = {name: (L * fl, L * by) for name, (fl, by) in per_layer.items()}
    ops = {"embedding": (0 * T, T * h * (wb + ab)), **ops}
    ops["final_norm"] = norm(T)
    ops["lm_head"] = linear(h, V, S)
    return ops


def step_costs(m: ModelShape, s: StepShape, *, causal: str = "exact") -> pd.DataFrame:
    """One row per op (scalar step) with FLOPs, bytes and arithmetic intensity."""
    ops = step_ops(m, s, causal=causal)
    frame = pd.DataFrame(
        {
            "op": list(ops),
            "flops": [float(np.sum(f)) for f, _ in ops.values()],
            "bytes": [float(np.sum(b)) for _, b in ops.values()],
        }
    )
    frame["intensity"] = frame["flops"] / frame["bytes"]
    return frame


def step_totals(m: ModelShape, s: StepShape, *, causal: str = "exact"):
    """(FLOPs, bytes) of whole steps: arrays when `s` holds arrays."""
    ops = step_ops(m, s, causal=causal).values()
    return sum(f for f, _ in ops), sum(b for _, b in ops)


def _moe_ops(m: ModelShape, T, linear) -> dict[str, tuple]:
    """One layer's router, shared-expert gate and routed experts (per-layer, like the rest)."""
    E, k, Ie, h = m.num_experts, m.experts_per_tok, m.moe_intermediate_size, m.hidden_size
    wb, ab, dq = m.weight_bytes, m.act_bytes, m.dequant_flops
    routed = T * k  # token-expert pairs
    touched = E * (1 - (1 - k / E) ** T)  # distinct experts hit, uniform routing

    def experts(kk, n):  # each touched expert's weight read (and dequantised) once
        return 2 * routed * kk * n + dq * kk * n * touched, touched * kk * n * wb + routed * (
            kk + n
        ) * ab

    ops = {
        "router": linear(h, E, T),
        "experts_gate_up": experts(h, 2 * Ie),
        "experts_silu_and_mul": (5 * routed * Ie, 3 * routed * Ie * ab),
        "experts_down": experts(Ie, h),
    }
    if m.intermediate_size:
        ops["shared_expert_gate"] = linear(h, 1, T)
    return ops


MATMUL_OPS = ("qkv_proj", "attention", "o_proj", "gate_up_proj", "down_proj", "lm_head")
MOE_MATMUL_OPS = ("router", "shared_expert_gate", "experts_gate_up", "experts_down")
